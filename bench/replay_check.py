"""The anomaly replay on a device: the `spike` scenario trained twice, once with the defaults (on the
GPU the per-channel statistics every 10th step, the quantization error every 10th) and once with
every statistic at every step. Checks that the step the scenario breaks is replayed (a
`full_statistics` event), that training is unchanged (the loss and grad-norm columns bit for bit),
and that the replayed step's statistics equal those of the run that takes them all. One JSON line.

Usage: python3 bench/replay_check.py BIN_DIR OUT_DIR [--device cuda] [--preset tiny] [--steps 256]
"""
import argparse, glob, json, os, subprocess, sys

import pyarrow as pa
import pyarrow.parquet as pq


def table(run, name):
    parts = sorted(glob.glob(os.path.join(run, name, "part-*.parquet")))
    return pa.concat_tables([pq.read_table(p) for p in parts]) if parts else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin"); ap.add_argument("out")
    ap.add_argument("--device", default="cuda"); ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=256)
    a = ap.parse_args()
    runs = {}
    for name, flags in (("defaults", []), ("every", ["--channel-stats-every", "1", "--quant-error-every", "1"])):
        run = os.path.join(a.out, f"replay-{name}")
        subprocess.run([os.path.join(a.bin, "fp8-capture"), "train", "--quiet", "--device", a.device, "--preset", a.preset,
                        "--recipe", "delayed", "--scenario", "spike", "--steps", str(a.steps), "--out", run] + flags, check=True)
        runs[name] = run
    ev = table(runs["defaults"], "events")
    replays = [] if ev is None else [r for r in ev.to_pylist() if r["kind"] == "full_statistics"]
    steps = sorted({r["step"] for r in replays})
    s_def, s_all = (table(runs[k], "steps").sort_by("step") for k in ("defaults", "every"))
    same_training = s_def.select(["step", "loss", "grad_norm"]).equals(s_all.select(["step", "loss", "grad_norm"]))
    cols = ["layer", "module", "gemm", "role", "amax", "saturated_frac", "amax_channel", "top_channel_sq_frac", "quant_mse", "quant_cos"]
    same_stats, filled = {}, {}
    for st in steps:
        keyed = []
        for k in ("defaults", "every"):
            t = table(runs[k], "stats")
            rows = [r for r in t.select(["step"] + cols).to_pylist() if r["step"] == st]
            keyed.append(sorted((tuple(r[c] for c in cols) for r in rows), key=repr))
        same_stats[st] = keyed[0] == keyed[1]
        filled[st] = all(v is not None for row in keyed[0] for v in row)
    ok = bool(steps) and same_training and all(same_stats.values()) and all(filled.values())
    print(json.dumps({"check": "anomaly_replay", "device": a.device, "replayed_steps": steps,
                      "why": [r["message"][:90] for r in replays], "training_bit_identical": same_training,
                      "replayed_stats_equal_every_step_run": same_stats, "every_column_filled": filled, "pass": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
