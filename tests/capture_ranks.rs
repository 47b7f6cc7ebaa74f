//! Data parallelism on the CPU (`fp8-capture train --dp N`) against one rank: the same seed and
//! global batch, so the same data in the same order. What must hold, and what reduction order
//! forbids:
//!
//! - step 1 (the same weights on every rank): the loss and every statistic of every cast, reduced
//!   across the ranks (amax, min and max by max/min, counts and numel summed, fractions recombined
//!   from their counts), are the one-rank run's bit for bit; mean and std, recombined in f64, within
//!   1e-12 relative;
//! - the gradients are summed over the ranks in rank order, which is not the order one rank's wgrad
//!   GEMM sums its rows in, and each rank's weight gradient is rounded to BF16 before the sum: from
//!   step 2 on every column drifts. The test bounds the drift and prints it (`--nocapture`); the
//!   figures are in capture/README.md.
//!
//! And the faults planted on the threads backend, each named by `fp8-analyze ranks`.

mod common;

use common::*;
use fp8scope_schemas::arrow_reexport::array::{Array, AsArray, RecordBatch};
use fp8scope_schemas::arrow_reexport::datatypes::{Float32Type, Float64Type, Int32Type, Int64Type};
use fp8scope_schemas::layout::{RunDir, Table};
use fp8scope_schemas::manifest::{Manifest, RunStatus};
use fp8scope_schemas::ranks::RankLiveness;
use std::collections::BTreeMap;
use std::path::Path;

const STEPS: u32 = 200;

fn table(run: &Path, t: Table) -> Vec<RecordBatch> {
    fp8scope_schemas::parts::read_table(&RunDir::new(run), t).expect("table reads")
}

fn f64c(b: &RecordBatch, name: &str) -> Vec<f64> {
    b.column_by_name(name).expect(name).as_primitive::<Float64Type>().values().to_vec()
}
fn f32c(b: &RecordBatch, name: &str) -> Vec<f64> {
    b.column_by_name(name).expect(name).as_primitive::<Float32Type>().values().iter().map(|&x| x as f64).collect()
}
fn i64c(b: &RecordBatch, name: &str) -> Vec<i64> {
    b.column_by_name(name).expect(name).as_primitive::<Int64Type>().values().to_vec()
}
fn rank_c(b: &RecordBatch) -> Vec<Option<i32>> {
    let c = b.column_by_name("rank").expect("rank").as_primitive::<Int32Type>();
    (0..c.len()).map(|i| c.is_valid(i).then(|| c.value(i))).collect()
}
fn strc(b: &RecordBatch, name: &str) -> Vec<String> {
    let c = b.column_by_name(name).expect(name).as_string::<i32>();
    (0..c.len()).map(|i| c.value(i).to_string()).collect()
}

/// A steps row reduced over ranks: (loss, grad_norm, lr, tokens).
type StepVals = (f64, f64, f64, i64);

/// step → values; asserts every rank wrote the same loss, grad norm and lr (they are global), and
/// sums the tokens.
fn steps(run: &Path, world: i32) -> BTreeMap<i64, StepVals> {
    let mut out: BTreeMap<i64, (StepVals, i32)> = BTreeMap::new();
    for b in table(run, Table::Steps) {
        let (st, loss, gn, lr, tok, rk) = (i64c(&b, "step"), f64c(&b, "loss"), f64c(&b, "grad_norm"), f64c(&b, "lr"), i64c(&b, "tokens"), rank_c(&b));
        for i in 0..b.num_rows() {
            assert_eq!(rk[i].is_some(), world > 1, "rank set exactly on runs of several ranks");
            let e = out.entry(st[i]).or_insert(((loss[i], gn[i], lr[i], 0), 0));
            assert_eq!(
                (e.0.0.to_bits(), e.0.1.to_bits(), e.0.2.to_bits()),
                (loss[i].to_bits(), gn[i].to_bits(), lr[i].to_bits()),
                "step {}: every rank has the global loss, norm and lr",
                st[i]
            );
            e.0.3 += tok[i];
            e.1 += 1;
        }
    }
    out.into_iter()
        .map(|(s, (v, n))| {
            assert_eq!(n, world, "step {s}: a row from every rank");
            (s, v)
        })
        .collect()
}

/// One cast's statistics, reduced over the ranks.
#[derive(Clone, Debug, Default)]
struct Stat {
    amax: f64,
    amax_used: f64,
    scale: f64,
    min: f64,
    max: f64,
    numel: i64,
    nan: i64,
    inf: i64,
    zeros: i64,
    saturated: i64,
    underflow: i64,
    /// Σx and Σx² over the ranks (from mean and std, population).
    sum: f64,
    sumsq: f64,
}

impl Stat {
    fn zero_frac(&self) -> f64 {
        if self.numel == 0 { 0.0 } else { self.zeros as f64 / self.numel as f64 }
    }
    fn saturated_frac(&self) -> f64 {
        if self.numel == 0 { 0.0 } else { self.saturated as f64 / self.numel as f64 }
    }
    fn underflow_frac(&self) -> f64 {
        let nz = self.numel - self.zeros - self.nan - self.inf;
        if nz == 0 { 0.0 } else { self.underflow as f64 / nz as f64 }
    }
    fn mean(&self) -> f64 {
        self.sum / self.numel as f64
    }
    fn std(&self) -> f64 {
        let m = self.mean();
        (self.sumsq / self.numel as f64 - m * m).max(0.0).sqrt()
    }
}

type Key = (i64, String, String, String); // step, "layer.module", gemm, role

/// Statistics per (step, tensor, GEMM), reduced across ranks. A weight is replicated, so its rows
/// must agree across ranks and count once; activations and gradients are sharded by rows, so their
/// counts add up.
fn stats(run: &Path) -> BTreeMap<Key, Stat> {
    let mut out: BTreeMap<Key, Stat> = BTreeMap::new();
    for b in table(run, Table::Stats) {
        let (st, layer, module, gemm, role) = (
            i64c(&b, "step"),
            b.column_by_name("layer").unwrap().as_primitive::<Int32Type>().values().to_vec(),
            strc(&b, "module"),
            strc(&b, "gemm"),
            strc(&b, "role"),
        );
        let (amax, used, scale, mn, mx) = (f32c(&b, "amax"), f32c(&b, "amax_used"), f32c(&b, "scale"), f32c(&b, "min"), f32c(&b, "max"));
        let (numel, nan, inf) = (i64c(&b, "numel"), i64c(&b, "nan_count"), i64c(&b, "inf_count"));
        let format = strc(&b, "format");
        let (zf, sf, uf, mean, std) = (f64c(&b, "zero_frac"), f64c(&b, "saturated_frac"), f64c(&b, "underflow_frac"), f64c(&b, "mean"), f64c(&b, "std"));
        for i in 0..b.num_rows() {
            let key = (st[i], format!("{}.{}", layer[i], module[i]), gemm[i].clone(), role[i].clone());
            let zeros = (zf[i] * numel[i] as f64).round() as i64;
            let row = Stat {
                amax: amax[i],
                amax_used: used[i],
                scale: scale[i],
                min: mn[i],
                max: mx[i],
                numel: numel[i],
                nan: nan[i],
                inf: inf[i],
                zeros,
                saturated: (sf[i] * numel[i] as f64).round() as i64,
                underflow: (uf[i] * (numel[i] - zeros - nan[i] - inf[i]) as f64).round() as i64,
                sum: mean[i] * numel[i] as f64,
                sumsq: (std[i] * std[i] + mean[i] * mean[i]) * numel[i] as f64,
            };
            match out.get_mut(&key) {
                None => {
                    out.insert(key, row);
                }
                Some(e) if role[i] == "weight" => {
                    assert_eq!((e.amax, e.scale, e.numel), (row.amax, row.scale, row.numel), "{key:?}: a replicated weight agrees across ranks");
                }
                Some(e) => {
                    e.amax = e.amax.max(row.amax);
                    if format[i] == "bf16" {
                        // No scale: a BF16 cast's amax_used is its own amax.
                        e.amax_used = e.amax_used.max(row.amax_used);
                    } else {
                        assert_eq!(e.amax_used.to_bits(), row.amax_used.to_bits(), "{key:?}: the reduced amax is every rank's");
                    }
                    e.min = e.min.min(row.min);
                    e.max = e.max.max(row.max);
                    e.numel += row.numel;
                    e.nan += row.nan;
                    e.inf += row.inf;
                    e.zeros += row.zeros;
                    e.saturated += row.saturated;
                    e.underflow += row.underflow;
                    e.sum += row.sum;
                    e.sumsq += row.sumsq;
                }
            }
        }
    }
    out
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b { 0.0 } else { (a - b).abs() / a.abs().max(b.abs()) }
}

/// The largest relative difference per column, over the steps from `from`.
fn stat_diffs(one: &BTreeMap<Key, Stat>, many: &BTreeMap<Key, Stat>, from: i64, to: i64) -> BTreeMap<&'static str, f64> {
    let mut d: BTreeMap<&'static str, f64> = BTreeMap::new();
    assert_eq!(one.len(), many.len(), "the same casts recorded");
    for (k, a) in one.range((from, String::new(), String::new(), String::new())..(to + 1, String::new(), String::new(), String::new())) {
        let b = many.get(k).unwrap_or_else(|| panic!("{k:?} missing from the run of several ranks"));
        assert_eq!(a.numel, b.numel, "{k:?}: numel");
        for (name, x, y) in [
            ("amax", a.amax, b.amax),
            ("amax_used", a.amax_used, b.amax_used),
            ("scale", a.scale, b.scale),
            ("min", a.min, b.min),
            ("max", a.max, b.max),
            ("zero_frac (abs)", a.zero_frac(), b.zero_frac()),
            ("saturated_frac (abs)", a.saturated_frac(), b.saturated_frac()),
            ("underflow_frac (abs)", a.underflow_frac(), b.underflow_frac()),
            ("mean (in stds)", a.mean(), b.mean()),
            ("std", a.std(), b.std()),
            ("nan+inf (abs)", (a.nan + a.inf) as f64, (b.nan + b.inf) as f64),
        ] {
            let v = if name.contains("(abs)") || name.contains("mean") {
                (x - y).abs() / if name.contains("mean") { a.std().max(1e-30) } else { 1.0 }
            } else {
                rel(x, y)
            };
            let e = d.entry(name).or_insert(0.0);
            *e = e.max(v);
        }
    }
    d
}

fn run(dir: &Path, name: &str, preset: &str, recipe: &str, dp: u32) -> std::path::PathBuf {
    let out = dir.join(name);
    let (out_s, steps, dp_s) = (out.display().to_string(), STEPS.to_string(), dp.to_string());
    let o = capture(&["train", "--preset", preset, "--recipe", recipe, "--device", "cpu", "--steps", &steps, "--dp", &dp_s, "--quiet", "--out", &out_s]);
    assert!(o.status.success(), "fp8-capture --dp {dp} failed: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// One preset and recipe: 1, 2 and 4 ranks.
fn equivalence(preset: &str, recipe: &str, loss_tol: f64) {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let one = run(dir.path(), "one", preset, recipe, 1);
    let (s1, st1) = (steps(&one, 1), stats(&one));
    assert_eq!(s1.len() as u32, STEPS);
    for dp in [2u32, 4] {
        let many = run(dir.path(), &format!("dp{dp}"), preset, recipe, dp);
        let m = Manifest::read(&many).expect("manifest");
        assert_eq!((m.status, m.world_size, m.ranks.len()), (RunStatus::Completed, Some(dp), dp as usize));
        let p = m.parallel.as_ref().expect("parallel");
        assert_eq!((p.launcher.as_str(), p.backend.as_deref(), p.groups[0].members[0].len()), ("fp8-capture", Some("threads"), dp as usize));
        assert_eq!(p.amax_groups.as_ref().expect("amax groups")["activation"], vec!["dp".to_string()]);
        for r in 0..dp {
            let l = RankLiveness::read(&many, r).expect("liveness").expect("a liveness file per rank");
            assert_eq!((l.status, l.steps_completed), (RunStatus::Completed, STEPS));
        }
        let (sn, stn) = (steps(&many, dp as i32), stats(&many));
        // Step 1: the same weights, so the loss (summed from the gathered per-token losses) is exact.
        let (a, b) = (s1[&1], sn[&1]);
        assert_eq!(a.0.to_bits(), b.0.to_bits(), "{preset} {recipe} dp {dp}: step 1 loss bit-identical");
        assert_eq!(a.3, b.3, "tokens summed over the ranks");
        // Step 1's statistics: exact but for mean and std, recombined in f64.
        let d1 = stat_diffs(&st1, &stn, 1, 1);
        for (col, v) in &d1 {
            let tol = if col.starts_with("mean") || *col == "std" { 1e-12 } else { 0.0 };
            assert!(*v <= tol, "{preset} {recipe} dp {dp}: step 1 {col} differs by {v:e}");
        }
        // Later steps: bounded drift.
        let mut dl = 0f64;
        let mut dg = 0f64;
        for (s, a) in &s1 {
            let b = sn[s];
            dl = dl.max(rel(a.0, b.0));
            dg = dg.max(rel(a.1, b.1));
            assert_eq!((a.2.to_bits(), a.3), (b.2.to_bits(), b.3), "step {s}: lr and tokens");
        }
        let tail = |s: &BTreeMap<i64, StepVals>| s.values().rev().take(20).map(|v| v.0).sum::<f64>() / 20.0;
        let final_gap = rel(tail(&s1), tail(&sn));
        let d = stat_diffs(&st1, &stn, 2, STEPS as i64);
        println!(
            "{preset} {recipe} dp {dp}: step-1 grad_norm rel {:.2e}; steps 2-{STEPS}: loss max rel {dl:.2e}, grad_norm max rel {dg:.2e}, final loss (mean of last 20) rel {final_gap:.2e}; stats {}",
            rel(a.1, b.1),
            d.iter().map(|(k, v)| format!("{k} {v:.2e}")).collect::<Vec<_>>().join(", ")
        );
        assert!(dl < loss_tol, "{preset} {recipe} dp {dp}: loss drifts {dl:e} (bound {loss_tol})");
        assert!(final_gap < 0.01, "{preset} {recipe} dp {dp}: final loss {final_gap:e} apart");
    }
}

#[test]
fn tiny_bf16_data_parallel_matches_one_rank() {
    equivalence("tiny", "bf16", 0.02);
}

#[test]
fn tiny_delayed_data_parallel_matches_one_rank() {
    equivalence("tiny", "delayed", 0.02);
}

#[test]
fn llama_tiny_bf16_data_parallel_matches_one_rank() {
    equivalence("llama-tiny", "bf16", 0.02);
}

#[test]
fn llama_tiny_delayed_data_parallel_matches_one_rank() {
    equivalence("llama-tiny", "delayed", 0.02);
}

/// `fp8-analyze ranks --json` on `run`: its findings as (check, module, role, ranks, step).
fn findings(run: &Path) -> Vec<(String, Option<String>, Option<String>, Vec<u64>, u64)> {
    let o = analyze(&["ranks", &run.display().to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("ranks --json: {e}: {}", String::from_utf8_lossy(&o.stderr)));
    v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().map(str::to_string);
            (
                s("check").unwrap_or_default(),
                s("module"),
                s("role"),
                f["ranks"].as_array().map(|r| r.iter().filter_map(|x| x.as_u64()).collect()).unwrap_or_default(),
                f["step"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn train_dp(dir: &Path, name: &str, extra: &[&str]) -> (std::path::PathBuf, std::process::Output) {
    let out = dir.join(name);
    let out_s = out.display().to_string();
    let mut args = vec!["train", "--preset", "tiny", "--steps", "30", "--quiet", "--out", out_s.as_str()];
    if !extra.contains(&"--device") {
        args.extend(["--device", "cpu"]);
    }
    if !extra.contains(&"--recipe") {
        args.extend(["--recipe", "delayed"]);
    }
    args.extend_from_slice(extra);
    (out.clone(), capture(&args))
}

/// The faults planted on the threads backend, and what `fp8-analyze ranks` says of each: a clean
/// job is clean; one rank's corrupted weight scale is `scale_disagrees` naming that rank, tensor
/// and first step; a rank that dies is `rank_stopped` (its liveness file still says running), the
/// others `rank_crashed` with the collective's error naming it, and the job `crashed`, exit 1;
/// amaxes left unreduced (every rank's amax_used its own) are `scale_disagrees` on that site, from
/// the first step the history holds an unreduced amax (the inferred-group check itself stays off
/// under delayed scaling, which `ranks` says).
#[test]
fn planted_faults_of_the_ranks_are_named_by_fp8_analyze_ranks() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let (clean, o) = train_dp(dir.path(), "clean", &["--dp", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(findings(&clean), vec![], "a clean job");
    // The casts table holds every FP8 operand of every rank: local amax beside used amax.
    let casts = table(&clean, Table::Casts);
    assert!(casts.iter().map(|b| b.num_rows()).sum::<usize>() > 0);
    assert!(casts.iter().all(|b| rank_c(b).iter().all(|r| r.is_some())));

    let (corrupt, o) = train_dp(dir.path(), "corrupt", &["--dp", "2", "--inject", "kind=scale-corrupt,rank=1,site=layers.0.fc1,step=10"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = findings(&corrupt);
    assert!(
        f.iter().any(|(c, m, r, k, s)| c == "scale_disagrees"
            && m.as_deref() == Some("layers.0.fc1")
            && r.as_deref() == Some("weight")
            && k == &[1]
            && *s == 10),
        "{f:?}"
    );
    assert!(f.iter().all(|(_, m, _, k, _)| k == &[1] && m.as_deref() == Some("layers.0.fc1")), "nothing else named: {f:?}");

    let (dies, o) = train_dp(dir.path(), "dies", &["--dp", "4", "--flush-every", "5", "--inject", "kind=rank-dies,rank=2,step=12"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 2 stopped without closing before step 12") && err.lines().count() == 1, "{err}");
    let m = Manifest::read(&dies).expect("manifest");
    assert_eq!(m.status, RunStatus::Crashed);
    let l2 = RankLiveness::read(&dies, 2).expect("liveness").expect("rank 2's file");
    assert_eq!((l2.status, l2.steps_completed), (RunStatus::Running, 10), "the dead rank closed nothing after its last flush");
    let mut f = findings(&dies);
    f.sort_by_key(|x| x.3.clone());
    let checks: Vec<(&str, &[u64])> = f.iter().map(|(c, _, _, k, _)| (c.as_str(), k.as_slice())).collect();
    assert_eq!(checks, vec![("rank_crashed", &[0u64][..]), ("rank_crashed", &[1][..]), ("rank_stopped", &[2][..]), ("rank_crashed", &[3][..])]);

    let (local, o) = train_dp(dir.path(), "local", &["--dp", "2", "--amax-history", "1", "--inject", "kind=amax-local,site=layers.1.fc2,step=5"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Each rank's amax_used of layers.1.fc2's gradient is its own history from step 6 on (a
    // history of 1: last step's amax): the ranks disagree, where the clean job's agree.
    let used = |run: &Path| {
        let mut per: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for b in table(run, Table::Casts) {
            let (st, layer, module, role, u, rk) = (
                i64c(&b, "step"),
                b.column_by_name("layer").unwrap().as_primitive::<Int32Type>().values().to_vec(),
                strc(&b, "module"),
                strc(&b, "role"),
                f32c(&b, "amax_used"),
                rank_c(&b),
            );
            for i in 0..b.num_rows() {
                if layer[i] == 1 && module[i] == "fc2" && role[i] == "gradient" && st[i] >= 6 {
                    per.entry(st[i]).or_default().push(u[i]);
                    assert!(rk[i].is_some());
                }
            }
        }
        per
    };
    let (c, l) = (used(&clean), used(&local));
    assert!(!c.is_empty() && c.values().all(|v| v.iter().all(|&x| x == v[0])), "clean: {c:?}");
    assert!(l.values().filter(|v| v.iter().any(|&x| x != v[0])).count() >= 20, "amax-local: {l:?}");
    // The configuration reduces activation and gradient amaxes over dp (`amax_groups`), so every
    // rank must hold the same amax_used and scale: the ranks that kept their own are named, from
    // the first step the history holds an unreduced amax.
    let f = findings(&local);
    assert!(
        f.iter().any(|(c, m, r, _, s)| c == "scale_disagrees"
            && m.as_deref() == Some("layers.1.fc2")
            && matches!(r.as_deref(), Some("activation" | "gradient"))
            && *s == 6),
        "{f:?}"
    );
    assert!(f.iter().all(|(c, m, _, _, _)| c == "scale_disagrees" && m.as_deref() == Some("layers.1.fc2")), "nothing else named: {f:?}");
    let v: serde_json::Value = serde_json::from_slice(&analyze(&["ranks", &local.display().to_string(), "--json"]).stdout).expect("json");
    assert!(
        v["checked"]["not_checked"].as_array().expect("not_checked").iter().any(|s| s.as_str().unwrap_or("").contains("amax groups")),
        "the inferred-group check stays off under delayed scaling"
    );
}

/// Bad `--dp` flags: one line each, exit 2.
#[test]
fn bad_rank_flags_are_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (extra, want) in [
        (&["--dp", "3"][..], "must be a multiple"),
        (&["--dp", "2", "--recipe", "current"][..], "use --recipe delayed or bf16"),
        (&["--dp", "2", "--device", "cuda"][..], "--device cpu"),
        (&["--inject", "kind=rank-dies,rank=0,step=3"][..], "needs --dp or --tp 2"),
        (&["--dp", "2", "--inject", "kind=rank-dies,rank=5,step=3"][..], "not one of the 2 ranks"),
        (&["--dp", "2", "--amax-reduce", "mesh"][..], "invalid value"),
    ] {
        let (_, o) = train_dp(dir.path(), "bad", extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(want) && err.trim().lines().count() == 1, "{extra:?}: {err}");
    }
}
