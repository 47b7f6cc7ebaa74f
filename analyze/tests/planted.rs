//! Every command against runs with planted answers (see `common`): the answer must be exactly the
//! planted one. Checked through `--json` of the built binary; a few checks of the text output.

mod common;

use common::*;
use fp8scope_schemas::names::{Gemm, Module, Role};
use fp8scope_schemas::tables::StatRow;
use serde_json::Value;

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Equal up to JSON's decimal round trip (serde_json parses floats to within an ulp or so).
fn same(got: &Value, want: f64) {
    let g = f(got);
    assert!((g - want).abs() <= 1e-14 * want.abs(), "{g} vs {want}");
}

#[test]
fn summary_reports_the_run_its_checkpoints_and_the_planted_worst_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fp8(tmp.path());
    let out = analyze(&["summary", &p(&run), "--json", "--top", "3"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["status"], "completed");
    assert_eq!(j["steps_recorded"], 200);
    assert_eq!(j["manifest"]["config"]["model"]["layers"], 2);
    let cps = j["checkpoints"].as_array().unwrap();
    let at = |name: &str| cps.iter().find(|c| c["at"] == name).unwrap_or_else(|| panic!("{name}"));
    assert_eq!((at("first")["step"].as_i64(), at("last")["step"].as_i64()), (Some(1), Some(200)));
    same(&at("first")["loss"], fp8_loss(1));
    same(&at("last")["loss"], fp8_loss(200));
    assert_eq!(at("50%")["step"], 101); // index round(199 · 0.5) = 100
    // layers.1.fc1's activation underflows 30% on 81 of 200 steps (120..=200): mean 0.1221.
    let u = &j["worst_underflow"][0];
    assert_eq!((u["tensor"].as_str(), u["gemm"].as_str()), (Some("layers.1.fc1.activation"), Some("fprop")));
    let expect = (119.0 * 0.001 + 81.0 * 0.3) / 200.0;
    assert!((f(&u["mean_underflow_frac"]) - expect).abs() < 1e-12, "{u}");
    assert_eq!(f(&u["max_underflow_frac"]), 0.3);
    assert_eq!(j["worst_underflow"].as_array().unwrap().len(), 3);
    let s = &j["worst_saturation"];
    assert_eq!(s.as_array().unwrap().len(), 1, "only one tensor saturates: {s}");
    assert_eq!((s[0]["tensor"].as_str(), f(&s[0]["mean_saturated_frac"])), (Some("layers.0.qkv.activation"), 0.05));

    let text = analyze(&["summary", &p(&run)]);
    assert_eq!(text.code, 0);
    assert!(text.stdout.contains("layers.1.fc1.activation") && text.stdout.contains("12.21%"), "{}", text.stdout);
}

#[test]
fn anomalies_finds_the_planted_drift_from_step_120_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let out = analyze(&["anomalies", &p(&run), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 1, "findings exit 1; stderr: {}", out.stderr);
    let j = out.json();
    assert_eq!(j["spikes"].as_array().unwrap().len(), 0, "{}", j["spikes"]);
    let d = &j["drift"];
    assert_eq!(d["first_step"], DRIFT_STEP);
    assert_eq!(d["confirmed_step"], DRIFT_STEP + 9); // --drift-steps 10
    assert_eq!(d["sign"], "above");
    assert_eq!(d["final_step"], 200);
    assert!((f(&d["final_raw_gap"]) - DRIFT_GAP).abs() < 0.0012, "{d}"); // the 0.1% noise
    assert!((f(&d["final_gap"]) - DRIFT_GAP).abs() < 0.0012, "{d}");
    assert_eq!(j["nonfinite"]["first_loss_step"], Value::Null);
    assert_eq!(j["nonfinite"]["first_tensor"], Value::Null);
    assert_eq!(j["params"]["spike_k"], 6.0);
    assert_eq!(j["params"]["drift_threshold"], 0.01);

    // The gap jumps at step 120 and stays: a jump against the baseline that never comes back in
    // band, which the drift covers (a step change, not a spike).
    let g = j["gap_spikes"].as_array().unwrap();
    assert_eq!(g.len(), 1, "{g:?}");
    assert_eq!((g[0]["start"].as_u64(), &g[0]["recovery"]), (Some(DRIFT_STEP as u64), &Value::Null));

    // The definitions react to their flags: a 15% threshold sees no drift in a 12% gap, and the
    // step change is then reported as a spike against the baseline that never recovers.
    let out = analyze(&["anomalies", &p(&run), "--baseline", &p(&base), "--json", "--drift-threshold", "0.15"]);
    assert_eq!((out.code, out.json()["drift"].clone()), (1, Value::Null));
    assert_eq!(out.json()["gap_spikes"][0]["start"].as_u64(), Some(DRIFT_STEP as u64));
    // A 13% minimum jump leaves nothing at all.
    let out = analyze(&["anomalies", &p(&run), "--baseline", &p(&base), "--json", "--drift-threshold", "0.15", "--spike-min-gap", "0.13"]);
    assert_eq!((out.code, out.json()["gap_spikes"].as_array().unwrap().len()), (0, 0));
}

#[test]
fn anomalies_finds_the_planted_spike_with_start_peak_and_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let run = spiky(tmp.path());
    let out = analyze(&["anomalies", &p(&run), "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let j = out.json();
    let spikes = j["spikes"].as_array().unwrap();
    assert_eq!(spikes.len(), 1, "{spikes:?}");
    let s = &spikes[0];
    assert_eq!((s["start"].as_i64(), s["peak"].as_i64(), s["recovery"].as_i64()), (Some(150), Some(151), Some(154)));
    same(&s["peak_loss"], spiky_loss(151));
    assert!(f(&s["peak_z"]) > 6.0);
    assert_eq!(j["drift"], Value::Null);
    let text = analyze(&["anomalies", &p(&run)]);
    assert!(text.stdout.contains(" 150 |") && text.stdout.contains("not checked"), "{}", text.stdout);
}

#[test]
fn anomalies_finds_the_planted_nan_in_layers_1_fc1_gradient_at_step_30() {
    let tmp = tempfile::tempdir().unwrap();
    let run = nan(tmp.path());
    let out = analyze(&["anomalies", &p(&run), "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["status"], "diverged");
    let nf = &j["nonfinite"];
    assert_eq!(nf["first_loss_step"], NAN_STEP + 1);
    let t = &nf["first_tensor"];
    assert_eq!(t["step"], NAN_STEP);
    assert_eq!(t["tensor"], "layers.1.fc1.gradient");
    assert_eq!((t["layer"].as_i64(), t["module"].as_str(), t["role"].as_str()), (Some(1), Some("fc1"), Some("gradient")));
    assert_eq!(t["gemm"], "dgrad");
    assert_eq!((t["source"].as_str(), t["nan_count"].as_i64()), (Some("stats"), Some(17)));
    assert_eq!(j["spikes"].as_array().unwrap().len(), 0);
}

#[test]
fn compare_returns_the_planted_cosine_of_every_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let out = analyze(&["compare", &p(&run), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 1, "flagged tensors exit 1; stderr: {}", out.stderr);
    let j = out.json();
    let steps = dump_steps(STEPS);
    assert_eq!(j["common_steps"].as_array().unwrap().len(), steps.len());
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), steps.len() * LAYERS as usize * 4 * 6);
    let mut flagged = 0;
    for t in tensors {
        let (step, layer) = (t["step"].as_u64().unwrap() as u32, t["layer"].as_u64().unwrap() as u32);
        let module = Module::parse(t["module"].as_str().unwrap()).unwrap();
        let role = Role::parse(t["role"].as_str().unwrap()).unwrap();
        let want = planted_cosine(step, layer, module, role);
        // f32 storage of the rotated values limits the agreement to ~1e-7.
        assert!((f(&t["cosine"]) - want).abs() < 2e-6, "{t}: planted {want}");
        assert_eq!(t["numel"], DUMP_ELEMS as u64, "weights come in two rows that add up");
        assert_eq!(t["flagged"].as_bool().unwrap(), want < 0.99, "{t}");
        flagged += (want < 0.99) as usize;
        // Same norms by construction: MSE = 2(1 − c)·‖b‖²/n, rel_l2 = √(2(1 − c)).
        assert!((f(&t["rel_l2"]) - (2.0 * (1.0 - want)).sqrt()).abs() < 1e-4, "{t}");
        assert!((f(&t["sqnr_db"]) + 10.0 * (2.0 * (1.0 - want)).log10()).abs() < 0.01, "{t}");
    }
    assert_eq!(j["flagged"], flagged);
    // Sorted by step then execution order: the first row is layers.0.qkv.weight at step 1.
    assert_eq!((tensors[0]["step"].as_i64(), tensors[0]["tensor"].as_str()), (Some(1), Some("layers.0.qkv.weight")));

    let text = analyze(&["compare", &p(&run), "--baseline", &p(&base), "--only-flagged"]);
    assert!(text.stdout.contains("layers.1.fc1.output") && !text.stdout.contains("layers.0.qkv.weight"), "{}", text.stdout);
}

#[test]
fn a_run_against_itself_has_cosine_one_mse_zero_and_no_anomalies() {
    let tmp = tempfile::tempdir().unwrap();
    let base = bf16(tmp.path());
    let out = analyze(&["compare", &p(&base), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for t in out.json()["tensors"].as_array().unwrap() {
        assert_eq!((f(&t["cosine"]), f(&t["mse"]), f(&t["max_abs_diff"])), (1.0, 0.0, 0.0), "{t}");
        assert_eq!(t["sqnr_db"], Value::Null, "infinite SQNR is null in JSON");
    }
    let out = analyze(&["anomalies", &p(&base), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 0, "no findings exit 0: {}", out.stdout);
    let j = out.json();
    assert_eq!((j["spikes"].as_array().unwrap().len(), &j["drift"]), (0, &Value::Null));
}

#[test]
fn locate_names_the_planted_gemm_from_the_dumped_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let out = analyze(&["locate", &p(&run), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["method"], "tensors");
    assert_eq!(j["first"], "layers.1.fc1.fprop");
    let top = &j["ranked"][0];
    assert_eq!(top["gemm_name"], "layers.1.fc1.fprop");
    assert_eq!(top["first_crossed"], DRIFT_STEP);
    // output error 1 − 0.95 minus input error 1 − 0.9999.
    assert!((f(&top["score"]) - 0.0499).abs() < 1e-5, "{top}");
    assert_eq!(top["inputs"], serde_json::json!(["activation", "weight"]));
    // Evidence at the crossing step: the activation underflows 30%.
    let ev = top["evidence"].as_array().unwrap();
    let act = ev.iter().find(|e| e["role"] == "activation").expect("activation evidence");
    assert_eq!((act["step"].as_i64(), f(&act["underflow_frac"])), (Some(DRIFT_STEP as i64), 0.3));
    // Every other GEMM adds less than the threshold: only the culprit crossed.
    let crossed: Vec<&str> =
        j["ranked"].as_array().unwrap().iter().filter(|g| !g["first_crossed"].is_null()).map(|g| g["gemm_name"].as_str().unwrap()).collect();
    assert_eq!(crossed, vec!["layers.1.fc1.fprop"]);
    assert_eq!(j["ranked"].as_array().unwrap().len(), LAYERS as usize * 4 * 3);

    // ... and holds its amax in the planted outlier channel.
    assert_eq!((act["amax_channel"].as_i64(), f(&act["top_channel_sq_frac"])), (Some(OUTLIER_CHANNEL as i64), OUTLIER_SHARE));
    let w = ev.iter().find(|e| e["role"] == "weight").expect("weight evidence");
    assert_eq!((w["amax_channel"].as_i64(), f(&w["top_channel_sq_frac"])), (Some(7), 0.03));
    assert_eq!(act["channel_step"], act["step"], "channels of the evidence step itself");

    let text = analyze(&["locate", &p(&run), "--baseline", &p(&base), "--top", "3"]);
    assert!(text.stdout.contains("first to cross") && text.stdout.contains("layers.1.fc1.fprop at step 120"), "{}", text.stdout);
    assert!(
        text.stdout.contains("channels of layers.1.fc1.fprop's operands at step 120: activation amax 2 in channel 33, top 1% of channels hold 87.00% of Σx²; weight amax 2 in channel 7, top 1% of channels hold 3.00% of Σx²"),
        "{}",
        text.stdout
    );
}

/// The FP8 run with `plant` applied to each stats row after the planted run's own, beside the BF16
/// baseline in `dir`: the run, the baseline, and the operand evidence of `locate --json`'s first
/// GEMM, which must be the planted layers.1.fc1.fprop.
fn located_evidence(dir: &std::path::Path, plant: impl Fn(&mut StatRow) + 'static) -> (std::path::PathBuf, std::path::PathBuf, Vec<Value>) {
    let mut plan = fp8_plan();
    let planted = std::mem::replace(&mut plan.stat, Box::new(|_| {}));
    plan.stat = Box::new(move |r| {
        planted(r);
        plant(r);
    });
    let (run, base) = (write_run(dir, &plan), bf16(dir));
    let out = analyze(&["locate", &p(&run), "--baseline", &p(&base), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let j = out.json();
    assert_eq!(j["first"], "layers.1.fc1.fprop");
    let ev = j["ranked"][0]["evidence"].as_array().unwrap().clone();
    (run, base, ev)
}

/// A run that took its channel statistics every 7th step (`--channel-stats-every 7`): the
/// crossing step (120) has none, so the evidence takes the operands' channels from step 119, with
/// that step's amax, and says so.
#[test]
fn locate_takes_channels_from_the_latest_step_that_has_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base, ev) = located_evidence(tmp.path(), |r| {
        if (r.layer, r.module, r.gemm, r.role, r.step) == (1, Module::Fc1, Gemm::Fprop, Role::Activation, DRIFT_STEP - 1) {
            (r.amax, r.amax_channel, r.top_channel_sq_frac) = (5.0, Some(OUTLIER_CHANNEL), Some(0.5));
        }
        if r.step % 7 != 0 {
            (r.amax_channel, r.top_channel_sq_frac) = (None, None);
        }
    });
    let act = ev.iter().find(|e| e["role"] == "activation").expect("activation evidence");
    // The step's own statistics, and the channels of step 119 with its amax.
    assert_eq!((act["step"].as_i64(), f(&act["underflow_frac"]), f(&act["amax"])), (Some(DRIFT_STEP as i64), 0.3, 2.0));
    assert_eq!((act["amax_channel"].as_i64(), f(&act["top_channel_sq_frac"])), (Some(OUTLIER_CHANNEL as i64), 0.5));
    assert_eq!((act["channel_step"].as_i64(), f(&act["channel_amax"])), (Some(DRIFT_STEP as i64 - 1), 5.0));
    let text = analyze(&["locate", &p(&run), "--baseline", &p(&base)]);
    assert!(
        text.stdout.contains("channels of layers.1.fc1.fprop's operands at step 120: activation amax 5 in channel 33 at step 119, top 1% of channels hold 50.00% of Σx²; weight amax 2 in channel 7 at step 119"),
        "{}",
        text.stdout
    );
}

/// Operands that took their channel statistics on different steps (a run from elsewhere): the
/// activation every 7th step, the weight every 11th. Each takes them from its own latest step
/// before the crossing (119 and 110), not the weight from the activation's step, where it has none.
#[test]
fn locate_takes_each_operands_channels_from_its_own_latest_step() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, _, ev) = located_evidence(tmp.path(), |r| {
        let fc1 = (r.layer, r.module, r.gemm) == (1, Module::Fc1, Gemm::Fprop);
        if fc1 && (r.role, r.step) == (Role::Activation, DRIFT_STEP - 1) {
            r.amax_channel = Some(OUTLIER_CHANNEL);
        }
        if fc1 && (r.role, r.step) == (Role::Weight, 110) {
            r.amax_channel = Some(9);
        }
        let every = if r.role == Role::Activation { 7 } else { 11 };
        if r.step % every != 0 {
            (r.amax_channel, r.top_channel_sq_frac) = (None, None);
        }
    });
    let at = |role: &str| {
        let e = ev.iter().find(|e| e["role"] == role).unwrap_or_else(|| panic!("{role} evidence"));
        (e["step"].as_i64(), e["channel_step"].as_i64(), e["amax_channel"].as_i64())
    };
    assert_eq!(at("activation"), (Some(DRIFT_STEP as i64), Some(119), Some(OUTLIER_CHANNEL as i64)));
    assert_eq!(at("weight"), (Some(DRIFT_STEP as i64), Some(110), Some(9)), "the weight's own latest channels");
}

#[test]
fn a_run_recorded_before_the_channel_columns_still_loads_with_them_null() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    // The same run in version 2, elsewhere, for a union of both versions.
    let new = fp8(&tmp.path().join("v2"));
    downgrade_to_v1(&run);
    let m: Value = serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(m["schema_version"], 1);

    for cmd in [vec!["summary", &p(&run)], vec!["anomalies", &p(&run), "--baseline", &p(&base)]] {
        let o = analyze(&cmd);
        assert!(o.code == 0 || o.code == 1, "{cmd:?} on a version-1 run: {}", o.stderr);
    }
    // locate: the same verdict and evidence, without channels.
    let o = analyze(&["locate", &p(&run), "--baseline", &p(&base), "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = o.json();
    assert_eq!(j["first"], "layers.1.fc1.fprop");
    let act = j["ranked"][0]["evidence"].as_array().unwrap().iter().find(|e| e["role"] == "activation").cloned().unwrap();
    assert_eq!((f(&act["underflow_frac"]), &act["amax_channel"], &act["top_channel_sq_frac"]), (0.3, &Value::Null, &Value::Null));
    let text = analyze(&["locate", &p(&run), "--baseline", &p(&base)]);
    assert!(text.code == 0 && !text.stdout.contains("channels of"), "no channel line without channel statistics: {}", text.stdout);
    // SQL over a version-1 and a version-2 run: one schema, the old run's channel columns null.
    let sql = "select run, count(*) as n, count(amax_channel) as with_channel, max(top_channel_sq_frac) as top from stats group by run order by run";
    let o = analyze(&["query", &p(&run), &p(&new), "--sql", sql, "--format", "json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rows: Value = o.json();
    let rows = rows.as_array().unwrap_or_else(|| panic!("rows: {rows}"));
    let n = (STEPS * LAYERS * 4 * 3 * 2) as i64;
    // Both runs are named fp8: each is labelled by its directory.
    let by_run = |dir: &std::path::Path| rows.iter().find(|r| r["run"].as_str() == Some(p(dir).as_str())).cloned().unwrap_or_else(|| panic!("{rows:?}"));
    let (old, cur) = (by_run(&run), by_run(&new));
    assert_eq!((old["n"].as_i64(), old["with_channel"].as_i64(), &old["top"]), (Some(n), Some(0), &Value::Null), "{old}");
    assert_eq!((cur["n"].as_i64(), cur["with_channel"].as_i64(), f(&cur["top"])), (Some(n), Some(n), OUTLIER_SHARE), "{cur}");
}

#[test]
fn locate_ranks_shadowed_gemms_by_harm_after_the_warm_up() {
    let tmp = tempfile::tempdir().unwrap();
    let run = shadowed(tmp.path());
    let out = analyze(&["locate", &p(&run), "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let j = out.json();
    assert_eq!((j["method"].as_str(), j["ranked_by"].as_str(), j["first"].as_str()), (Some("shadow"), Some("harm"), Some("layers.0.fc2.dgrad")));
    let top = &j["ranked"][0];
    assert_eq!(top["gemm_name"], "layers.0.fc2.dgrad");
    assert_eq!((top["first_crossed"].as_i64(), top["peak_step"].as_i64()), (Some(100), Some(100)));
    assert!((f(&top["peak_error"]) - 0.1).abs() < 1e-12);
    // harm = ‖δ‖·‖dual‖: √(mse·numel) · √(numel·(std² + mean²)) of the activation (std 0.5).
    let want = (SHADOW_BAD_MSE * 32768.0).sqrt() * (32768.0f64 * 0.25).sqrt();
    assert!((f(&top["score"]) - want).abs() < 1e-9 * want, "{} vs {want}", top["score"]);
    let grad = top["evidence"].as_array().unwrap().iter().find(|e| e["role"] == "gradient").cloned().unwrap();
    assert_eq!(f(&grad["underflow_frac"]), 0.42);
    // The GEMMs of equal harm tie: execution order breaks the tie (layers.0.qkv.fprop first).
    assert_eq!(j["ranked"][1]["gemm_name"], "layers.0.qkv.fprop");
    assert_eq!(j["ranked"][2]["gemm_name"], "layers.0.proj.fprop");
    let ranked = j["ranked"].as_array().unwrap();
    let find = |name: &str| ranked.iter().position(|g| g["gemm_name"] == name).unwrap();
    // The largest local error on a tiny result does the least harm: ranked last.
    let harmless = find("layers.1.proj.dgrad");
    assert_eq!(harmless, ranked.len() - 1, "ranked last by harm");
    assert!((f(&ranked[harmless]["peak_error"]) - 0.2).abs() < 1e-12 && f(&ranked[harmless]["peak_error"]) > f(&top["peak_error"]));
    // The warm-up's error (step 1, every amax_used 0) neither scores nor crosses.
    let warm = &ranked[find("layers.1.qkv.wgrad")];
    assert_eq!(warm["warmup_until"], 1);
    assert_eq!((warm["errors"][0]["step"].as_i64(), warm["errors"][0]["warmup"].as_bool()), (Some(1), Some(true)));
    assert_eq!(warm["first_crossed"], Value::Null, "{warm}");
    assert!(f(&warm["peak_error"]) < 0.01, "the warm-up's error of 1 is left out: {}", warm["peak_error"]);
    let text = analyze(&["locate", &p(&run)]);
    assert!(text.stdout.contains("ranked by harm") && text.stdout.contains("warm-up"), "{}", text.stdout);
}

#[test]
fn query_joins_two_runs_per_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, base) = (fp8(tmp.path()), bf16(tmp.path()));
    let sql = "WITH a AS (SELECT layer, AVG(underflow_frac) AS u FROM stats WHERE run = 'fp8' GROUP BY layer), \
               b AS (SELECT layer, AVG(underflow_frac) AS u FROM stats WHERE run = 'bf16' GROUP BY layer) \
               SELECT a.layer, a.u AS fp8_underflow, b.u AS bf16_underflow FROM a JOIN b ON a.layer = b.layer ORDER BY a.layer";
    let out = analyze(&["query", &p(&run), &p(&base), "--sql", sql, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows = out.json();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    // Per layer 24 operand rows per step; layer 1 has one at 0.3 on 81 steps.
    let l1 = (24.0 * 200.0 * 0.001 - 81.0 * 0.001 + 81.0 * 0.3) / (24.0 * 200.0);
    assert_eq!(rows[0]["layer"], 0);
    assert!((f(&rows[0]["fp8_underflow"]) - 0.001).abs() < 1e-15);
    assert!((f(&rows[1]["fp8_underflow"]) - l1).abs() < 1e-12, "{:?}", rows[1]);
    assert!((f(&rows[1]["bf16_underflow"]) - 0.001).abs() < 1e-15);

    // The run column tells runs apart in every table.
    let out = analyze(&["query", &p(&run), &p(&base), "--sql", "SELECT run, COUNT(*) AS n FROM steps GROUP BY run ORDER BY run", "--format", "csv"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "run,n\nbf16,200\nfp8,200\n");
    // A bare COUNT(*) or COUNT(1) over the runs' parts (polars sums the parts' counts as UInt128).
    for count in ["COUNT(*)", "COUNT(1)"] {
        let out = analyze(&["query", &p(&run), &p(&base), "--sql", &format!("SELECT {count} AS n FROM steps"), "--format", "csv"]);
        assert_eq!(out.code, 0, "{count}: {}", out.stderr);
        assert_eq!(out.stdout, "n\n400\n", "{count}");
    }
}

#[test]
fn query_writes_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let run = nan(tmp.path());
    let sql = "SELECT step, kind, layer, message FROM events ORDER BY step";
    let table = analyze(&["query", &p(&run), "--sql", sql]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(table.stdout.contains("nonfinite_loss") && table.stdout.contains("(2 rows)"), "{}", table.stdout);
    let csv = analyze(&["query", &p(&run), "--sql", sql, "--format", "csv"]);
    assert_eq!(csv.stdout.lines().next(), Some("step,kind,layer,message"));
    assert_eq!(csv.stdout.lines().nth(2), Some("31,nonfinite_loss,,loss is NaN"));
    let json = analyze(&["query", &p(&run), "--sql", sql, "--format", "json"]);
    assert_eq!(json.json()[1]["layer"], Value::Null);
    // Lists come out as arrays; the tensors table is queryable like any other.
    let v =
        analyze(&["query", &p(&run), "--sql", "SELECT \"values\" FROM tensors WHERE step = 1 AND layer = 0 AND module = 'qkv' AND role = 'output'", "--json"]);
    assert_eq!(v.json()[0]["values"].as_array().map(|a| a.len()), Some(DUMP_ELEMS));
    let file = tmp.path().join("out.parquet");
    let pq = analyze(&["query", &p(&run), "--sql", sql, "--format", "parquet", "--output", &p(&file)]);
    assert_eq!((pq.code, pq.stdout.as_str()), (0, ""), "{}", pq.stderr);
    let bytes = std::fs::read(&file).unwrap();
    assert!(bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"));
    let out_csv = tmp.path().join("out.csv");
    let c = analyze(&["query", &p(&run), "--sql", sql, "--format", "csv", "--output", &p(&out_csv)]);
    assert_eq!(c.code, 0);
    assert_eq!(std::fs::read_to_string(out_csv).unwrap(), csv.stdout);
}

#[test]
fn every_command_documents_an_example_in_its_help() {
    for cmd in ["summary", "anomalies", "compare", "locate", "query"] {
        let out = analyze(&[cmd, "--help"]);
        assert_eq!(out.code, 0);
        assert!(out.stdout.contains("Example:") && out.stdout.contains(&format!("fp8-analyze {cmd} ")), "{cmd}: {}", out.stdout);
        assert!(out.stdout.contains("--json"), "{cmd}");
    }
}
