#!/usr/bin/env python3
"""The early warnings (quantization bias, gradient below quantization noise, weight oscillation)
over the scenario and planted-fault library and clean runs (CPU): when each fires against when the
loss moves.

For each case: the FP8 run at the default statistics cadence (quant_mse / quant_bias at step 1 and
every 10 steps), its BF16 baseline with the same arguments, and `fp8-analyze --json anomalies` of the
pair. The table gives the first loss anomaly (gap spike, drift or non-finite loss), the first step of
each mechanism kind, and two figures recomputed here in Python from the stats and steps tables, an
independent check of the analyzer's arithmetic: the lowest gradient-to-noise ratio
R = ||g|| / ||wgrad quantization noise|| (independent-rounding model, see
analyze/src/analysis/early_warnings.rs), the largest |quant_bias| of an FP8 operand, and the mean
and largest flip_ratio of the fprop weights.

    python3 bench/early_warnings.py --bin $CARGO_TARGET_DIR/release --out bench/results/early-warnings
"""
import argparse, collections, glob, json, math, os, shutil, subprocess, sys

import pyarrow.parquet as pq

CASES = [
    ("tiny", "clean s0", []),
    ("tiny", "clean s1", ["--seed", "1"]),
    ("tiny", "clean s2", ["--seed", "2"]),
    ("llama-tiny", "clean s0", []),
    ("llama-tiny", "clean s1", ["--seed", "1"]),
    ("tiny", "nvfp4 (recipe)", ["@nvfp4"]),
    ("tiny", "clean, lr 1e-4", ["--lr", "1e-4"]),
    ("tiny", "drift", ["--scenario", "drift"]),
    ("tiny", "spike", ["--scenario", "spike"]),
    ("tiny", "nan", ["--scenario", "nan"]),
    ("llama-tiny", "drift", ["--scenario", "drift"]),
    ("llama-tiny", "swiglu-outliers", ["--scenario", "swiglu-outliers"]),
    ("tiny", "l1.fc2.fprop overflow x2 @100", ["--inject", "site=layers.1.fc2,gemm=fprop,kind=overflow,step=100,magnitude=1"]),
    ("tiny", "l1.fc2.fprop overflow x4 @100", ["--inject", "site=layers.1.fc2,gemm=fprop,kind=overflow,step=100,magnitude=2"]),
    ("tiny", "l1.fc2.dgrad overflow @100", ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]),
    ("tiny", "l1.fc2.wgrad underflow @100", ["--inject", "site=layers.1.fc2,gemm=wgrad,kind=underflow,step=100"]),
    ("tiny", "l1.proj.wgrad underflow @50", ["--inject", "site=layers.1.proj,gemm=wgrad,kind=underflow,step=50"]),
    ("tiny", "l0.qkv.dgrad outlier @100", ["--inject", "site=layers.0.qkv,gemm=dgrad,kind=outlier,step=100"]),
    ("llama-tiny", "l1.qkv.wgrad underflow @50", ["--inject", "site=layers.1.qkv,gemm=wgrad,kind=underflow,step=50"]),
    ("tiny", "l1.fc1 weight oscillation @100", ["--inject", "site=layers.1.fc1,kind=oscillation,step=100"]),
    ("llama-tiny", "l0.qkv weight oscillation @100", ["--inject", "site=layers.0.qkv,kind=oscillation,step=100"]),
]


def table(run, name):
    files = sorted(glob.glob(os.path.join(run, name, "**", "*.parquet"), recursive=True))
    return pq.read_table(files).to_pylist() if files else []


def python_figures(run):
    """(lowest R, largest |quant_bias| of an FP8 operand after warm-up, mean and largest flip_ratio of
    the fprop weights), recomputed from the tables."""
    stats, steps = table(run, "stats"), {r["step"]: r["grad_norm"] for r in table(run, "steps")}
    sites = collections.defaultdict(dict)
    worst_bias = 0.0
    flips = [r["flip_ratio"] for r in stats if r.get("flip_ratio") is not None]
    for r in stats:
        if r["quant_mse"] is None:
            continue
        if r["format"] != "bf16" and (r["amax_used"] or 0) > 0 and r["quant_bias"] is not None:
            worst_bias = max(worst_bias, abs(r["quant_bias"]))
        sites[(r["step"], r["layer"], r["module"])][(r["gemm"], r["role"])] = r
    noise = collections.defaultdict(float)
    for (step, _, _), d in sites.items():
        dy, x, w = d.get(("wgrad", "gradient")), d.get(("wgrad", "activation")), d.get(("fprop", "weight"))
        if not (dy and x and w):
            continue
        tokens = math.sqrt(dy["numel"] * x["numel"] / w["numel"])
        m, k = dy["numel"] / tokens, x["numel"] / tokens
        sq = lambda o: o["numel"] * (o["std"] ** 2 + o["mean"] ** 2)
        noise[step] += dy["quant_mse"] * m * sq(x) + x["quant_mse"] * k * sq(dy)
    ratios = [steps[s] / math.sqrt(n) for s, n in noise.items() if n > 0 and math.isfinite(steps.get(s, math.nan))]
    flip = (sum(flips) / len(flips), max(flips)) if flips else (None, None)
    return (min(ratios) if ratios else None), worst_bias, flip


def first_loss_anomaly(v):
    steps = []
    if v.get("drift"):
        steps.append(v["drift"]["first_step"])
    steps += [s["start"] for s in v.get("gap_spikes") or [] if not s.get("within_noise")]
    if (v.get("nonfinite") or {}).get("first_loss_step") is not None:
        steps.append(v["nonfinite"]["first_loss_step"])
    return min(steps) if steps else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="directory holding fp8-capture and fp8-analyze")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "runs")
    shutil.rmtree(work, ignore_errors=True)
    cap, ana = os.path.join(a.bin, "fp8-capture"), os.path.join(a.bin, "fp8-analyze")
    lines = ["| preset | case | loss anomaly | quantization bias | gradient below noise | weight oscillation | other mechanisms | min R | max abs bias | flip ratio mean / max |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, (preset, label, args) in enumerate(CASES):
        recipe = "nvfp4" if "@nvfp4" in args else "delayed"
        args = [x for x in args if x != "@nvfp4"]
        base_args = [x for j, x in enumerate(args) if not (x == "--inject" or (j > 0 and args[j - 1] == "--inject"))]
        fp8, bf16 = os.path.join(work, f"{i}-fp8"), os.path.join(work, f"{i}-bf16")
        for out, rec, extra in ((fp8, recipe, args), (bf16, "bf16", base_args)):
            r = subprocess.run([cap, "train", "--preset", preset, "--device", "cpu", "--quiet", "--recipe", rec, "--out", out] + extra, capture_output=True, text=True)
            if r.returncode not in (0, 3):
                sys.exit(f"{label}: fp8-capture failed: {r.stderr.strip()}")
        r = subprocess.run([ana, "--json", "anomalies", fp8, "--baseline", bf16], capture_output=True, text=True)
        v = json.loads(r.stdout)
        firsts = {}
        for m in v["mechanisms"]:
            firsts.setdefault(m["kind"], m)
        def cell(k):
            if k not in firsts:
                return "-"
            m = firsts[k]
            value = {"quantization bias": f"{m['value']:+.3g}", "gradient below quantization noise": f"R {m['value']:.3g}"}.get(k, f"{m['value']:.3g}")
            return f"step {m['step']} ({m['gemm_name']} {m['role']}, {value})"

        warnings = ("quantization bias", "gradient below quantization noise", "weight oscillation")
        others = ", ".join(f"{k} @{m['step']}" for k, m in firsts.items() if k not in warnings) or "-"
        lo, bias, (flip_mean, flip_max) = python_figures(fp8)
        flip = "-" if flip_mean is None else f"{flip_mean:.3f} / {flip_max:.2f}"
        anomaly = first_loss_anomaly(v)
        row = (f"| {preset} | {label} | {anomaly if anomaly is not None else '-'} | {cell('quantization bias')} | "
               f"{cell('gradient below quantization noise')} | {cell('weight oscillation')} | {others} | {lo:.2f} | {bias:.4f} | {flip} |")
        print(row, flush=True)
        lines.append(row)
    with open(os.path.join(a.out, "early-warnings.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
