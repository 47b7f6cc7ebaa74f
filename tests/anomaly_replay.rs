//! End to end: with the per-channel statistics and the quantization error taken only every 10th
//! step, the step where the `spike` scenario goes wrong still gets every statistic. It is launched again with them
//! before the optimizer runs, so training is unchanged: the run's losses are bit for bit those of a
//! run that takes every statistic at every step, and so are the spike step's statistics.

mod common;

use common::{HEAVY, query_csv as csv, train_tiny};

#[test]
fn the_spike_step_gets_every_statistic_and_training_is_unchanged() {
    let _g = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (sparse, full) = (dir.path().join("sparse"), dir.path().join("full"));
    let common = ["--recipe", "delayed", "--scenario", "spike", "--steps", "256", "--quiet"];
    train_tiny(&sparse, &[&common[..], &["--channel-stats-every", "10", "--quant-error-every", "10"]].concat());
    train_tiny(&full, &[&common[..], &["--channel-stats-every", "1", "--quant-error-every", "1"]].concat());

    let ev = csv(&sparse, "SELECT step, message FROM events WHERE kind = 'full_statistics'");
    let steps: Vec<&str> = ev.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    // The scenario's batch at step 251 saturates layer 0's qkv input (the flight recorder's trigger).
    assert!(steps.contains(&"251") && ev.contains("saturation burst"), "the scenario's spike at step 251 is replayed: {ev}");
    assert_eq!(csv(&full, "SELECT step FROM events WHERE kind = 'full_statistics'").lines().count(), 1, "nothing to replay");

    // Training is unchanged, bit for bit.
    let losses = "SELECT step, loss, grad_norm FROM steps ORDER BY step";
    assert_eq!(csv(&sparse, losses), csv(&full, losses));
    // The spike step has every statistic, the same as the run that takes them all.
    let at = |step: u32| {
        format!(
            "SELECT layer, module, role, gemm, amax, amax_channel, top_channel_sq_frac, quant_mse, quant_cos FROM stats WHERE step = {step} ORDER BY layer, module, gemm, role"
        )
    };
    let spike = csv(&sparse, &at(251));
    assert!(spike.lines().count() > 10 && !spike.contains(",,"), "every column filled at step 251:\n{spike}");
    assert_eq!(spike, csv(&full, &at(251)));
    // A step between the cadence's, not anomalous, goes without them.
    let quiet = csv(&sparse, "SELECT layer FROM stats WHERE step = 245 AND amax_channel IS NULL AND quant_mse IS NULL");
    assert_eq!(quiet.lines().count() - 1, spike.lines().count() - 1, "step 245 has the lighter set: {quiet}");
}
