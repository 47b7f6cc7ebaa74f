#!/usr/bin/env python3
"""The loss gap of each recipe to BF16, against the noise band, on the CPU presets: for each preset
(`tiny`, `llama-tiny`), a BF16 baseline and two BF16 replicas (`--init-jitter 1`, `2`: the runs that
should be equivalent), then one run per recipe: delayed, mxfp8, nvfp4, and per-GEMM recipes (the
forward in MXFP8 with the gradients in delayed FP8 or BF16; NVFP4 with the forward in BF16, as the
NVFP4 pretraining paper's App. D). For each: the final loss (mean of the last 20 steps), its gap to
the baseline in %, and the gap in units of the band, the largest |final gap| of a replica.
Writes OUT/recipe_gaps.md and OUT/recipe_gaps.jsonl.

Usage: python3 bench/recipe_gaps.py --bin BIN_DIR --out OUT [--presets tiny,llama-tiny] [--steps N]
"""
import argparse, concurrent.futures as cf, glob, json, os, subprocess, time

import pyarrow.parquet as pq

RECIPES = ["delayed", "mxfp8", "nvfp4", "fprop=mxfp8,dgrad=delayed,wgrad=delayed", "fprop=mxfp8,dgrad=bf16,wgrad=bf16",
           "fprop=bf16,dgrad=nvfp4,wgrad=nvfp4"]


def final_loss(run):
    rows = []
    for p in sorted(glob.glob(os.path.join(run, "steps", "part-*.parquet"))):
        t = pq.read_table(p, columns=["step", "loss"]).to_pydict()
        rows += list(zip(t["step"], t["loss"]))
    rows.sort()
    tail = [l for _, l in rows[-20:]]
    return sum(tail) / len(tail)


def train(binary, out, preset, steps, name, flags):
    run = os.path.join(out, "runs", f"{preset}-{name}")
    t0 = time.time()
    cmd = [binary, "train", "--quiet", "--device", "cpu", "--preset", preset, "--threads", "1", "--out", run] + (["--steps", str(steps)] if steps else []) + flags
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return name, run, time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True); ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default="tiny,llama-tiny"); ap.add_argument("--steps", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "runs"), exist_ok=True)
    binary = os.path.join(a.bin, "fp8-capture")
    rows = []
    for preset in a.presets.split(","):
        jobs = [("bf16", ["--recipe", "bf16"]), ("bf16-r1", ["--recipe", "bf16", "--init-jitter", "1"]),
                ("bf16-r2", ["--recipe", "bf16", "--init-jitter", "2"])] + [(r, ["--recipe", r]) for r in RECIPES]
        with cf.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
            done = {n: (run, s) for n, run, s in ex.map(lambda j: train(binary, a.out, preset, a.steps, *j), jobs)}
        base = final_loss(done["bf16"][0])
        band = max(abs(final_loss(done[r][0]) / base - 1) for r in ("bf16-r1", "bf16-r2"))
        for r in RECIPES:
            gap = final_loss(done[r][0]) / base - 1
            row = dict(preset=preset, recipe=r, final_loss=round(final_loss(done[r][0]), 5), bf16_final=round(base, 5),
                       gap_pct=round(100 * gap, 3), band_pct=round(100 * band, 3), gap_over_band=round(gap / band, 2) if band else None,
                       seconds=round(done[r][1], 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "recipe_gaps.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    lines = ["| preset | recipe | final loss | BF16 final | gap | band (2 replicas) | gap / band | s |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['preset']} | `{r['recipe']}` | {r['final_loss']:.4f} | {r['bf16_final']:.4f} | {r['gap_pct']:+.2f}% | {r['band_pct']:.2f}% | "
              f"{r['gap_over_band']:+.1f} | {r['seconds']:.0f} |" for r in rows]
    open(os.path.join(a.out, "recipe_gaps.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
