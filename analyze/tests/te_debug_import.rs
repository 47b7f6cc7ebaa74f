//! `import te-debug` on the fixtures of `tests/fixtures/te_debug/` (written by make_fixtures.py with
//! Transformer Engine's documented statistic names): every line lands in `stats` or `extra_stats`
//! with the value the log holds (checked against an independent reading of the log text and a
//! mapping table written here), ranks, names with `_` and `.`, columnwise and recipe-prefixed
//! statistics, NVFP4, a cut last line (skipped and counted), a malformed line (one error naming the
//! file and line), and an existing run that is never overwritten.

mod common;

use fp8_analyze::commands::query::query;
use fp8_analyze::error::AnalyzeError;
use fp8_analyze::import::te_debug::{DeviceArg, TeDebugArgs, TeRecipe, import};
use fp8_analyze::load::{LoadOptions, Run, f64s, i64s, strs};
use fp8scope_schemas::manifest::{Manifest, RunSource, RunStatus};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    common::package_dir().join("tests/fixtures/te_debug").join(name)
}

fn args(log_dir: PathBuf, out: PathBuf, recipe: Option<TeRecipe>) -> TeDebugArgs {
    TeDebugArgs { log_dir, out, name: None, recipe, step_offset: 1, device: DeviceArg::Cuda }
}

/// One log line read independently of the importer: rank, iteration, the whole name, value.
struct Ref {
    rank: u32,
    iteration: u32,
    name: String,
    value: f64,
}

/// Reads every complete line of every rank log: `... <name> <ws> iteration=N <ws> value=V\n`.
fn reference(dir: &Path) -> (Vec<Ref>, usize) {
    let stats = dir.join("nvdlfw_inspect_statistics_logs");
    let mut out = Vec::new();
    let mut cut = 0;
    for rank in 0..8u32 {
        let p = stats.join(format!("nvdlfw_inspect_globalrank-{rank}.log"));
        let Ok(text) = std::fs::read_to_string(&p) else { continue };
        let complete = text.rfind('\n').map_or("", |i| &text[..=i]);
        cut += usize::from(complete.len() < text.len());
        for l in complete.lines() {
            let msg = l.split(" - INFO - ").nth(1).expect("INFO line");
            let w: Vec<&str> = msg.split_whitespace().collect();
            out.push(Ref {
                rank,
                iteration: w[1].trim_start_matches("iteration=").parse().unwrap(),
                name: w[0].to_string(),
                value: w[2].trim_start_matches("value=").parse().unwrap(),
            });
        }
    }
    (out, cut)
}

/// Where this test expects a statistic: a stats column (with the factor applied to the logged
/// value), or extra_stats.
fn expected(stat: &str, training: &str) -> Option<(&'static str, fn(f64) -> f64, bool)> {
    let cw = stat.ends_with("_columnwise");
    let base = stat.trim_end_matches("_columnwise");
    let base = base.strip_prefix(&format!("{training}_")).unwrap_or(base);
    let id = |x| x;
    let pct = |x| x / 100.0;
    let inv = |x: f64| 1.0 / x;
    Some(match base {
        "min" | "max" | "mean" | "std" if !cw => (
            if base == "min" {
                "min"
            } else if base == "max" {
                "max"
            } else if base == "mean" {
                "mean"
            } else {
                "std"
            },
            id,
            cw,
        ),
        "cur_amax" => ("amax", id, cw),
        "dynamic_range" => ("dynamic_range_log2", id, cw),
        "underflows%" => ("underflow_frac", pct, cw),
        "overflows%" => ("saturated_frac", pct, cw),
        "scale_inv_max" => ("scale", inv, cw),
        "mse" => ("quant_mse", id, cw),
        _ => return None,
    })
}

const TENSORS: [&str; 6] = ["activation", "gradient", "weight", "output", "wgrad", "dgrad"];

fn split(name: &str) -> (String, String, String) {
    let (i, t) = TENSORS.iter().filter_map(|t| name.rfind(&format!("_{t}_")).map(|i| (i, *t))).max().unwrap();
    (name[..i].to_string(), t.to_string(), name[i + t.len() + 2..].to_string())
}

/// The GEMM a cast of `tensor` feeds (rowwise or columnwise), as Transformer Engine uses it.
fn gemm(tensor: &str, cw: bool) -> &'static str {
    match (tensor, cw) {
        ("activation", false) | ("weight", false) | ("output", _) => "fprop",
        ("gradient", false) | ("weight", true) | ("dgrad", _) => "dgrad",
        _ => "wgrad",
    }
}

type StatKey = (i64, Option<i64>, String, String, String); // step, rank, module, gemm, role

/// Every (row key, column) → value of the stats table, and (step, rank, module, tensor, stat) →
/// value of extra_stats.
fn tables(out: &Path) -> (BTreeMap<(StatKey, String), Option<f64>>, BTreeMap<(i64, Option<i64>, String, String, String), f64>) {
    let runs = vec![Run::open(out, LoadOptions::default()).unwrap()];
    let cols = ["min", "max", "mean", "std", "amax", "dynamic_range_log2", "underflow_frac", "saturated_frac", "scale", "quant_mse"];
    let df = query(&runs, "SELECT * FROM stats").unwrap();
    let (st, rk, mo, ge, ro) =
        (i64s(&df, "step").unwrap(), i64s(&df, "rank").unwrap(), strs(&df, "module").unwrap(), strs(&df, "gemm").unwrap(), strs(&df, "role").unwrap());
    let mut stats = BTreeMap::new();
    for c in cols {
        let v = f64s(&df, c).unwrap();
        for i in 0..df.height() {
            let key = (st[i].unwrap(), rk[i], mo[i].clone().unwrap(), ge[i].clone().unwrap(), ro[i].clone().unwrap());
            stats.insert((key, c.to_string()), v[i]);
        }
    }
    let df = query(&runs, "SELECT * FROM extra_stats").unwrap();
    let (st, rk, mo, te, sn, va) = (
        i64s(&df, "step").unwrap(),
        i64s(&df, "rank").unwrap(),
        strs(&df, "module").unwrap(),
        strs(&df, "tensor").unwrap(),
        strs(&df, "stat").unwrap(),
        f64s(&df, "value").unwrap(),
    );
    let extra =
        (0..df.height()).map(|i| ((st[i].unwrap(), rk[i], mo[i].clone().unwrap(), te[i].clone().unwrap(), sn[i].clone().unwrap()), va[i].unwrap())).collect();
    (stats, extra)
}

/// Checks that every reference line is in stats (where the table above says, within the f32
/// rounding of the column) or in extra_stats (exactly); returns (mapped, kept).
fn every_line_lands(refs: &[Ref], out: &Path, training: &str, multi: bool) -> (usize, usize) {
    let (stats, extra) = tables(out);
    let (mut mapped, mut kept) = (0, 0);
    // The first statistic to fill a column of a row keeps it; a second one is kept by name.
    let mut claimed: BTreeMap<(StatKey, String), String> = BTreeMap::new();
    for r in refs {
        let (module, tensor, stat) = split(&r.name);
        let step = r.iteration as i64 + 1;
        let rank = multi.then_some(r.rank as i64);
        let kept_key = (step, rank, module.clone(), tensor.clone(), stat.clone());
        let want = expected(&stat, training).filter(|(_, f, _)| f(r.value).is_finite());
        let in_stats = want.and_then(|(c, f, cw)| {
            let key = ((step, rank, module.clone(), gemm(&tensor, cw).to_string(), tensor.clone()), c.to_string());
            if claimed.entry(key.clone()).or_insert_with(|| stat.clone()) != &stat {
                return None;
            }
            let got = stats.get(&key).copied().flatten()?;
            let w = f(r.value);
            ((got - w).abs() <= 1e-6 * w.abs().max(1e-30)).then_some(())
        });
        match (in_stats, extra.get(&kept_key)) {
            (Some(()), _) => mapped += 1,
            (None, Some(v)) => {
                assert_eq!(*v, r.value, "{} rank {} iteration {}: extra_stats holds another value", r.name, r.rank, r.iteration);
                kept += 1;
            }
            (None, None) => panic!("{} (rank {}, iteration {}, value {}) is in neither stats nor extra_stats", r.name, r.rank, r.iteration, r.value),
        }
    }
    (mapped, kept)
}

#[test]
fn multi_rank_delayed_logs_map_or_keep_every_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("te");
    let dir = fixture("multi_rank");
    let rep = import(&args(dir.clone(), out.clone(), None)).unwrap();
    let (refs, cut) = reference(&dir);
    assert_eq!((refs.len(), cut), (671, 1), "the fixture: 336 + 335 complete lines, then one cut");
    assert_eq!(rep.lines, refs.len(), "the cut line is not read");
    assert_eq!(rep.skipped_lines.len(), 1);
    assert!(rep.skipped_lines[0].ends_with("globalrank-1.log:336"), "{:?}", rep.skipped_lines);
    assert_eq!((rep.recipe, rep.recipe_inferred), (TeRecipe::Delayed, true));
    assert_eq!(rep.ranks, vec![0, 1]);
    let (mapped, kept) = every_line_lands(&refs, &out, "fp8_delayed_scaling", true);
    assert_eq!((mapped, kept), (rep.mapped_lines, rep.kept_lines), "the importer's counts agree");
    assert_eq!(mapped + kept, refs.len());
    // The what-ifs, norms, scale_inv_min, the scale_inv_max rounded to 0 and the second statistic
    // for saturated_frac are kept by name.
    for s in ["mxfp8_underflows%", "fp8_block_scaling_mse_columnwise", "l1_norm", "l2_norm", "scale_inv_min", "fp8_delayed_scaling_overflows%", "scale_inv_max"]
    {
        assert!(rep.kept_stats.iter().any(|k| k == s), "{s} kept: {:?}", rep.kept_stats);
    }

    let m = Manifest::read(&out).unwrap();
    assert_eq!(m.source, RunSource::TeDebug);
    assert_eq!(m.status, RunStatus::Crashed, "a cut last line means training was stopped while logging");
    let o = m.origin.as_ref().unwrap();
    assert_eq!(o.stats_decimals, Some(4));
    assert_eq!(
        o.modules,
        vec!["model.layers.0.self_attention.layernorm_qkv", "model.layers.1.mlp.fc_2", "model.output_layer"],
        "first-seen order, names with _ and . whole"
    );
    assert_eq!(o.lacks, vec!["loss", "dumps", "shadow", "events"]);
    assert!(o.notes.iter().any(|n| n.contains("24 scale_inv_max value(s) were rounded to 0")), "{:?}", o.notes);
    assert_eq!(m.rows.stats as usize + m.rows.extra_stats as usize, rep.stats_rows as usize + rep.extra_stats_rows as usize);

    // The layer column is the module path's first integer; a weight's rowwise statistics serve
    // fprop and, under per-tensor scaling, dgrad too.
    let runs = vec![Run::open(&out, LoadOptions::default()).unwrap()];
    let df = query(&runs, "SELECT DISTINCT module, layer FROM stats ORDER BY module").unwrap();
    assert_eq!(i64s(&df, "layer").unwrap(), vec![Some(0), Some(1), Some(0)]);
    let df = query(
        &runs,
        "SELECT gemm, underflow_frac, scale FROM stats WHERE module = 'model.layers.1.mlp.fc_2' AND role = 'weight' AND rank = 1 AND step = 3 ORDER BY gemm",
    )
    .unwrap();
    assert_eq!(strs(&df, "gemm").unwrap(), vec![Some("dgrad".into()), Some("fprop".into())]);
    // k = 1 + 1 + 0.5 + 0.2 = 2.7: underflows% 1.5k = 4.05 → 0.0405; scale_inv 0.0001k → 0.0003.
    for u in f64s(&df, "underflow_frac").unwrap() {
        assert!((u.unwrap() - 0.0405).abs() < 1e-12);
    }
    for sc in f64s(&df, "scale").unwrap() {
        assert!((sc.unwrap() - 1.0 / 0.0003).abs() < 1e-2, "scale = 1 / scale_inv_max as logged (0.0003)");
    }
}

#[test]
fn columnwise_mxfp8_stats_go_to_the_transposed_casts_gemm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture("mxfp8_columnwise");
    // The recipe is not in the names: without --recipe the import says so.
    let e = import(&args(dir.clone(), tmp.path().join("none"), None)).unwrap_err().to_string();
    assert!(e.contains("--recipe"), "{e}");
    assert!(!tmp.path().join("none").exists(), "nothing written when the import is refused");
    let out = tmp.path().join("mx");
    let rep = import(&args(dir.clone(), out.clone(), Some(TeRecipe::Mxfp8))).unwrap();
    let (refs, _) = reference(&dir);
    let (mapped, kept) = every_line_lands(&refs, &out, "mxfp8", false);
    assert_eq!((mapped, kept, rep.lines), (rep.mapped_lines, rep.kept_lines, 108));
    assert_eq!(rep.kept_stats, vec!["scale_inv_min_columnwise"]);
    let runs = vec![Run::open(&out, LoadOptions::default()).unwrap()];
    // blocks.0.mlp.fc_1 at iteration 1: k = 2.1; the activation's columnwise cast feeds wgrad.
    let df = query(
        &runs,
        "SELECT gemm, underflow_frac, quant_mse, max, rank FROM stats WHERE module = 'blocks.0.mlp.fc_1' AND role = 'activation' AND step = 2 ORDER BY gemm",
    )
    .unwrap();
    assert_eq!(strs(&df, "gemm").unwrap(), vec![Some("fprop".into()), Some("wgrad".into())]);
    let u = f64s(&df, "underflow_frac").unwrap();
    assert!((u[0].unwrap() - 0.042).abs() < 1e-12 && (u[1].unwrap() - 0.063).abs() < 1e-12, "{u:?}");
    let q = f64s(&df, "quant_mse").unwrap();
    assert!(q[0].is_none() && (q[1].unwrap() - 0.0263).abs() < 1e-12, "mxfp8_mse_columnwise on the wgrad row only (0.02625 logged as 0.0263): {q:?}");
    assert_eq!(f64s(&df, "max").unwrap().iter().filter(|m| m.is_some_and(|m| (m - 2.625).abs() < 1e-6)).count(), 2, "the tensor's own max on both rows");
    assert!(i64s(&df, "rank").unwrap().iter().all(Option::is_none), "one log: rank is null");
}

#[test]
fn nvfp4_and_plain_pytorch_logs_import() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("fp4");
    let rep = import(&args(fixture("nvfp4"), out.clone(), Some(TeRecipe::Nvfp4))).unwrap();
    assert_eq!((rep.lines, rep.mapped_lines, rep.kept_lines), (12, 12, 0));
    let runs = vec![Run::open(&out, LoadOptions::default()).unwrap()];
    let df = query(&runs, "SELECT layer, format, underflow_frac, quant_mse FROM stats WHERE role = 'gradient' AND gemm = 'dgrad' AND step = 2").unwrap();
    assert_eq!((i64s(&df, "layer").unwrap()[0], strs(&df, "format").unwrap()[0].clone()), (Some(3), Some("nvfp4".into())));
    assert!((f64s(&df, "underflow_frac").unwrap()[0].unwrap() - 0.055).abs() < 1e-12);
    assert!((f64s(&df, "quant_mse").unwrap()[0].unwrap() - 0.0031).abs() < 1e-12);

    // nvdlfw_inspect's own LogTensorStats on a plain model: no FP8 statistic, so a bf16 run.
    let out = tmp.path().join("plain");
    let rep = import(&args(fixture("plain_torch"), out.clone(), None)).unwrap();
    assert_eq!((rep.recipe, rep.lines, rep.kept_stats.clone()), (TeRecipe::Bf16, 120, vec!["l1_norm".to_string(), "l2_norm".to_string()]));
    let (refs, _) = reference(&fixture("plain_torch"));
    let (mapped, kept) = every_line_lands(&refs, &out, "", false);
    assert_eq!((mapped, kept), (80, 40));
    let m = Manifest::read(&out).unwrap();
    assert_eq!((m.status, m.config.model.layers), (RunStatus::Completed, 3), "model.0 and model.2: layers 0 and 2");
}

#[test]
fn a_malformed_line_stops_the_import_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bad");
    let e = import(&args(fixture("bad_line"), out.clone(), None)).unwrap_err();
    assert!(matches!(e, AnalyzeError::BadLog { line: 2, .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("nvdlfw_inspect_globalrank-0.log:2:") && msg.contains("iteration"), "{msg}");
    assert!(!out.exists(), "nothing written");
    let e = import(&args(tmp.path().to_path_buf(), out.clone(), None)).unwrap_err().to_string();
    assert!(e.contains("no nvdlfw_inspect statistics logs"), "{e}");
}

#[test]
fn an_existing_run_is_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("te");
    import(&args(fixture("nvfp4"), out.clone(), Some(TeRecipe::Nvfp4))).unwrap();
    let before = std::fs::read(out.join("run.json")).unwrap();
    let e = import(&args(fixture("plain_torch"), out.clone(), None)).unwrap_err().to_string();
    assert!(e.contains("already holds a run"), "{e}");
    assert_eq!(std::fs::read(out.join("run.json")).unwrap(), before, "the run is untouched");
    let other = tmp.path().join("busy");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    let e = import(&args(fixture("plain_torch"), other.clone(), None)).unwrap_err().to_string();
    assert!(e.contains("not an empty directory"), "{e}");
}
