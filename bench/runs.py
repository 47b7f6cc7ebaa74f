#!/usr/bin/env python3
"""Reads fp8-capture runs (steps/part-*.parquet) for the GPU checks and the benchmark.

  runs.py parity CPU_RUN GPU_RUN [--tol 0.01]   GPU loss within tol (relative) of the CPU's at every step
  runs.py same RUN_A RUN_B                      the two loss columns are bit-identical
  runs.py speed RUN [--skip 10]                 median step_ms after the first `skip` steps (JSON)
  runs.py final RUN                             mean loss of the last 20 steps, and ln V (JSON)
Exits 1 when a check fails.
"""
import glob
import json
import math
import os
import sys

import pyarrow.parquet as pq


def steps(run):
    parts = sorted(glob.glob(os.path.join(run, "steps", "part-*.parquet")))
    if not parts:
        sys.exit(f"{run}: no steps parts")
    rows = {}
    for p in parts:
        t = pq.read_table(p).to_pydict()
        for i, s in enumerate(t["step"]):
            rows[s] = {k: t[k][i] for k in t}
    return [rows[s] for s in sorted(rows)]


def arg(name, default):
    if name in sys.argv:
        return type(default)(sys.argv[sys.argv.index(name) + 1])
    return default


def main():
    cmd = sys.argv[1]
    if cmd == "parity":
        cpu, gpu = steps(sys.argv[2]), steps(sys.argv[3])
        tol = arg("--tol", 0.01)
        n = min(len(cpu), len(gpu))
        worst = max(range(n), key=lambda i: abs(gpu[i]["loss"] - cpu[i]["loss"]) / abs(cpu[i]["loss"]))
        rel = abs(gpu[worst]["loss"] - cpu[worst]["loss"]) / abs(cpu[worst]["loss"])
        ok = n == len(cpu) == len(gpu) and rel <= tol and all(math.isfinite(r["loss"]) for r in gpu)
        print(json.dumps({"check": "parity", "steps": n, "worst_step": gpu[worst]["step"], "cpu_loss": cpu[worst]["loss"],
                          "gpu_loss": gpu[worst]["loss"], "max_rel_diff": rel, "tol": tol,
                          "final_cpu": cpu[n - 1]["loss"], "final_gpu": gpu[n - 1]["loss"], "pass": ok}))
        sys.exit(0 if ok else 1)
    if cmd == "same":
        a, b = steps(sys.argv[2]), steps(sys.argv[3])
        diff = [x["step"] for x, y in zip(a, b) if x["loss"] != y["loss"]]
        ok = len(a) == len(b) and not diff
        print(json.dumps({"check": "determinism", "steps": len(a), "differing_steps": diff[:10], "pass": ok}))
        sys.exit(0 if ok else 1)
    if cmd == "speed":
        s = steps(sys.argv[2])
        skip = arg("--skip", 10)
        ms = sorted(r["step_ms"] for r in s[skip:])
        print(json.dumps({"run": os.path.basename(sys.argv[2]), "steps": len(s), "median_ms": ms[len(ms) // 2],
                          "mean_ms": sum(ms) / len(ms), "tokens": s[0]["tokens"], "final_loss": s[-1]["loss"]}))
        return
    if cmd == "final":
        s = steps(sys.argv[2])
        tail = [r["loss"] for r in s[-20:]]
        m = json.load(open(os.path.join(sys.argv[2], "run.json")))
        print(json.dumps({"run": os.path.basename(sys.argv[2]), "steps": len(s), "final_loss": sum(tail) / len(tail),
                          "ln_vocab": m.get("data", {}).get("ln_vocab"), "entropy_floor": m.get("data", {}).get("entropy_floor")}))
        return
    sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
