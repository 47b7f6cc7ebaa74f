#!/usr/bin/env python3
"""Predicted against measured recovery over the scenario and planted-fault library (CPU).

For each case (a built-in scenario or a planted fault, on `tiny` and `llama-tiny`): a BF16
baseline, the FP8 run with shadow GEMMs, `fp8-analyze predict` on it, then one real run per
predicted set (each GEMM kind in BF16, the top-1 GEMM, the recommended set). The measured recovery
of a set is 1 - gap(routed) / gap(fp8), gaps being the relative final-loss gaps to the baseline; a
non-finite FP8 run counts a routed run that ends finite within 5% of the baseline as recovered (1),
else 0. Cases whose FP8 gap is under --min-gap are left out (nothing to recover) and listed.

Prints and writes (under --out) a markdown table, the Spearman rank correlation between predicted
and measured recovery (for predict's headline share, which is the excess share wherever a GEMM has
an excess, and for the bound, signed and excess shares) and the mean absolute error, over every case and over the cases whose FP8 run ends finite (a first-order share
cannot say which routing keeps a run from going non-finite: those cases are reported beside).
Each case also trains --replicas BF16 replicas with jittered initial weights (their largest final
gap is the case's noise band) and the FP8 run once more with jittered weights (its gap's change is
the FP8 run's spread); the larger of the two over |FP8 gap| is the resolution of its measured
recoveries (the table's ± noise column): sets measured 0.997 and 1.004 of a gap are equal
within it, and the rank correlation cannot do better than the noise that orders them.

Beside them, the noise ceiling: the rank correlation two re-measurements of the same recoveries
would reach, each moved by Gaussian noise of half its resolution (what a predictor that knew the
true recoveries could expect against measurements this noisy).

    python3 bench/predict_library.py --bin $CARGO_TARGET_DIR/release --out bench/results/predict-library
    python3 bench/predict_library.py --bin BIN --out OUT --parallel 8   # 8 cases at once (16 cores: 2 threads a run)
"""
import argparse, concurrent.futures, json, math, os, random, shutil, subprocess, sys, threading, time

CASES = [
    ("tiny", "drift", ["--scenario", "drift"]),
    ("tiny", "spike", ["--scenario", "spike"]),
    ("tiny", "nan", ["--scenario", "nan"]),
    ("tiny", "l1.fc2.dgrad overflow@100", ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]),
    ("tiny", "l0.fc1.fprop overflow@100", ["--inject", "site=layers.0.fc1,gemm=fprop,kind=overflow,step=100"]),
    ("tiny", "l1.proj.wgrad underflow@50", ["--inject", "site=layers.1.proj,gemm=wgrad,kind=underflow,step=50"]),
    ("tiny", "l0.qkv.dgrad outlier@100", ["--inject", "site=layers.0.qkv,gemm=dgrad,kind=outlier,step=100"]),
    ("llama-tiny", "l1.fc2.dgrad overflow@100", ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l0.fc1.fprop overflow@100", ["--inject", "site=layers.0.fc1,gemm=fprop,kind=overflow,step=100"]),
    ("llama-tiny", "l1.qkv.wgrad underflow@50", ["--inject", "site=layers.1.qkv,gemm=wgrad,kind=underflow,step=50"]),
    ("llama-tiny", "drift", ["--scenario", "drift"]),
    ("llama-tiny", "spike", ["--scenario", "spike"]),
    ("llama-tiny", "nan", ["--scenario", "nan"]),
    ("llama-tiny", "swiglu-outliers", ["--scenario", "swiglu-outliers"]),
    ("tiny", "massive-activations", ["--scenario", "massive-activations"]),
    ("llama-tiny", "massive-activations", ["--scenario", "massive-activations"]),
    ("tiny", "l0.proj.wgrad overflow@100", ["--inject", "site=layers.0.proj,gemm=wgrad,kind=overflow,step=100"]),
    ("tiny", "l1.qkv.fprop nan@120", ["--inject", "site=layers.1.qkv,gemm=fprop,kind=nan,step=120"]),
    ("tiny", "l1.fc1.dgrad overflow@80", ["--inject", "site=layers.1.fc1,gemm=dgrad,kind=overflow,step=80"]),
    ("llama-tiny", "l0.proj.dgrad overflow@100", ["--inject", "site=layers.0.proj,gemm=dgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l1.fc1.wgrad overflow@100", ["--inject", "site=layers.1.fc1,gemm=wgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l1.qkv.fprop outlier@100", ["--inject", "site=layers.1.qkv,gemm=fprop,kind=outlier,step=100"]),
    ("llama-tiny", "l0.fc2.fprop nan@120", ["--inject", "site=layers.0.fc2,gemm=fprop,kind=nan,step=120"]),
    # Two faults at once, in different GEMMs: each routing recovers a part of the gap, so the
    # ranking is tested between 0 and 1 too.
    ("tiny", "l1.fc2.dgrad + l0.proj.wgrad overflow@100",
     ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "--inject", "site=layers.0.proj,gemm=wgrad,kind=overflow,step=100"]),
    ("tiny", "l0.fc1.fprop overflow@100 + l1.fc1.dgrad overflow@80",
     ["--inject", "site=layers.0.fc1,gemm=fprop,kind=overflow,step=100", "--inject", "site=layers.1.fc1,gemm=dgrad,kind=overflow,step=80"]),
    ("tiny", "l1.fc2.dgrad + l0.fc1.dgrad overflow@100",
     ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "--inject", "site=layers.0.fc1,gemm=dgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l1.fc2.dgrad + l1.fc1.wgrad overflow@100",
     ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "--inject", "site=layers.1.fc1,gemm=wgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l0.fc1.fprop + l0.proj.dgrad overflow@100",
     ["--inject", "site=layers.0.fc1,gemm=fprop,kind=overflow,step=100", "--inject", "site=layers.0.proj,gemm=dgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l1.qkv.fprop outlier + l1.fc2.dgrad overflow@100",
     ["--inject", "site=layers.1.qkv,gemm=fprop,kind=outlier,step=100", "--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]),
]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def final_loss(d):
    try:
        m = json.load(open(os.path.join(d, "run.json")))
    except (OSError, ValueError):
        return None
    v = m.get("final_loss")
    return v if v is None or math.isfinite(v) else float("nan")


def rel_gap(x, base):
    if x is None or base is None or not math.isfinite(x):
        return float("nan")
    return (x - base) / base


def measured_recovery(g_fp8, g_set):
    if not math.isfinite(g_fp8):
        return 1.0 if math.isfinite(g_set) and abs(g_set) < 0.05 else 0.0
    if not math.isfinite(g_set):
        return 0.0
    return 1.0 - g_set / g_fp8


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va > 0 and vb > 0 else float("nan")


def run_case(ci, preset, label, flags, a, cap, ana, work, log):
    """Records one case's runs; returns (rows, skipped)."""
    rows, skipped = [], []
    cdir = os.path.join(work, f"case{ci:02d}")
    shutil.rmtree(cdir, ignore_errors=True)
    os.makedirs(cdir)
    common = ["train", "--preset", preset, "--device", "cpu"] + flags
    # The baseline trains the same data without the planted defect (a fault is FP8's).
    plain = ["train", "--preset", preset, "--device", "cpu"] + (flags if flags[0] == "--scenario" else [])
    base = os.path.join(cdir, "baseline")
    run([cap] + plain + ["--recipe", "bf16", "--out", base])
    fp8 = os.path.join(cdir, "fp8")
    run([cap] + common + ["--recipe", "delayed", "--dump-every", str(a.dump_every), "--shadow", "--out", fp8])
    lb, lf = final_loss(base), final_loss(fp8)
    if lb is None or not math.isfinite(lb):
        skipped.append({"preset": preset, "case": label, "error": "the BF16 baseline did not end finite"})
        return rows, skipped
    g_fp8 = rel_gap(lf, lb) if lf is not None and math.isfinite(lf) else float("inf")
    if math.isfinite(g_fp8) and abs(g_fp8) < a.min_gap:
        log(f"{preset} {label}: baseline {lb}, fp8 {lf} (gap {g_fp8:+.4f}): left out")
        skipped.append({"preset": preset, "case": label, "fp8_gap": g_fp8})
        return rows, skipped
    # The noise band: the largest final gap of a BF16 replica with its initial weights jittered
    # (as triage measures it); a measured recovery is known to within band / |FP8 gap|.
    reps = []
    for k in range(1, a.replicas + 1):
        rd = os.path.join(cdir, f"replica-{k}")
        run([cap] + plain + ["--recipe", "bf16", "--init-jitter", str(k), "--out", rd])
        reps.append(abs(rel_gap(final_loss(rd), lb)))
    band = max(reps) if reps else 0.0
    # The FP8 run's own spread: the same FP8 run with its initial weights jittered. A routed run
    # moves the trajectory further than a BF16 replica's jitter does, so a measured recovery is
    # known to within the larger of the two spreads. A run that went non-finite has no gap to spread.
    fp8_spread = 0.0
    if math.isfinite(g_fp8):
        fp8_rep = os.path.join(cdir, "fp8-replica")
        run([cap] + common + ["--recipe", "delayed", "--init-jitter", "1", "--out", fp8_rep])
        fp8_spread = abs(rel_gap(final_loss(fp8_rep), lb) - g_fp8)
        if not math.isfinite(fp8_spread):
            fp8_spread = 0.0
    lines = [f"{preset} {label}: baseline {lb}, fp8 {lf} (gap {g_fp8:+.4f}, band {band:.4f}, FP8 spread {fp8_spread:.4f})"]
    p = run([ana, "--json", "predict", fp8])
    if p.returncode != 0:
        log("\n".join(lines + [f"  predict failed: {p.stderr.strip()}"]))
        skipped.append({"preset": preset, "case": label, "error": p.stderr.strip()})
        return rows, skipped
    pred = json.loads(p.stdout)
    sets, seen = [], set()
    for s in pred["sets"] + [pred["recommended"]]:
        key = tuple(sorted(s["gemms"]))
        if s["name"] in ("top-2", "top-3") or not key or key in seen:
            continue
        seen.add(key)
        sets.append(s)
    for s in sets:
        d = os.path.join(cdir, s["name"])
        if s["name"].startswith("bf16-"):
            route = ["--bf16-gemms", s["name"][5:]]
        else:
            route = ["--bf16-sites", ",".join("{}:{}".format(*g.rsplit(".", 1)) for g in s["gemms"])]
        r = run([cap] + common + ["--recipe", "delayed", "--out", d] + route)
        if r.returncode not in (0, 3):
            lines.append(f"  {s['name']}: capture failed: {r.stderr.strip()[-300:]}")
            continue
        g = rel_gap(final_loss(d), lb)
        m = measured_recovery(g_fp8, g)
        # `recovery` is predict's headline share (the excess where any GEMM has one); the bound
        # and signed shares are kept beside it.
        rows.append({"preset": preset, "case": label, "set": s["name"], "gemms": s["gemms"], "fp8_gap": g_fp8, "set_gap": g,
                     "predicted": s["bound_recovery"], "predicted_signed": s.get("signed_recovery"),
                     "predicted_excess": s.get("excess_recovery"), "headline": s["recovery"], "ranked_by": pred.get("ranked_by"),
                     "measured": m, "band": band, "fp8_spread": fp8_spread,
                     "resolution": max(band, fp8_spread) / abs(g_fp8) if math.isfinite(g_fp8) else 0.0,
                     "bf16_flops_share": s["bf16_flops_share"]})
        lines.append(f"  {s['name']:12s} predicted {s['recovery']:.3f} (bound {s['bound_recovery']:.3f}, signed {s.get('signed_recovery')}, excess {s.get('excess_recovery')}) measured {m:.3f} (gap {g:+.4f})")
    log("\n".join(lines))
    return rows, skipped


def noise_ceiling(rows, draws=400, seed=0):
    """The median Spearman of two re-measurements of the same recoveries, each measured recovery
    moved by Gaussian noise of sigma = resolution / 2: what a predictor that knew every true
    recovery could expect against measurements this noisy (the table's ± noise)."""
    rng = random.Random(seed)
    out = []
    for _ in range(draws):
        m1 = [r["measured"] + rng.gauss(0, r["resolution"] / 2) for r in rows]
        m2 = [r["measured"] + rng.gauss(0, r["resolution"] / 2) for r in rows]
        out.append(spearman(m1, m2))
    out.sort()
    return out[len(out) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="directory of fp8-capture and fp8-analyze")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None, help="where the runs go (default: OUT/runs, removed at the end)")
    ap.add_argument("--min-gap", type=float, default=0.02)
    ap.add_argument("--dump-every", type=int, default=25)
    ap.add_argument("--cases", default=None, help="comma-separated indices into the library")
    ap.add_argument("--replicas", type=int, default=2, help="BF16 replicas with jittered initial weights per case (the noise band)")
    ap.add_argument("--parallel", type=int, default=1, help="cases recorded at once (each run then gets cores / N threads)")
    ap.add_argument("--report-only", action="store_true", help="record nothing: the report of OUT/cases.jsonl as it stands")
    a = ap.parse_args()
    cap, ana = os.path.join(a.bin, "fp8-capture"), os.path.join(a.bin, "fp8-analyze")
    os.makedirs(a.out, exist_ok=True)
    work = a.work or os.path.join(a.out, "runs")
    picked = list(enumerate(CASES)) if a.cases is None else [(int(i), CASES[int(i)]) for i in a.cases.split(",")]
    if a.parallel > 1:
        os.environ["RAYON_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // a.parallel))
    t0 = time.time()
    lock = threading.Lock()

    def log(text):
        with lock:
            print(f"[{time.time() - t0:6.0f}s] {text}", flush=True)

    # Each case's rows go to OUT/cases.jsonl as it ends (a run cut short keeps what it finished;
    # the files of several machines, concatenated, make one report with --report-only).
    cases_file = os.path.join(a.out, "cases.jsonl")

    def one(c):
        rs, ss = run_case(c[0], *c[1], a, cap, ana, work, log)
        with lock, open(cases_file, "a") as f:
            f.write(json.dumps({"index": c[0], "rows": rs, "skipped": ss}) + "\n")

    if not a.report_only:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
            list(pool.map(one, picked))
    # In library order, whatever order they finished in; a case recorded twice counts once (its last).
    by_index = {}
    for line in open(cases_file):
        if line.strip():
            c = json.loads(line)
            by_index[c["index"]] = c
    rows = [r for i in sorted(by_index) for r in by_index[i]["rows"]]
    skipped = [x for i in sorted(by_index) for x in by_index[i]["skipped"]]

    def scores(rs):
        ms = [r["measured"] for r in rs]
        out = {"cases": len(rs)}
        for key, field in [("headline", "headline"), ("bound", "predicted"), ("signed", "predicted_signed"), ("excess", "predicted_excess")]:
            pr = [r[field] if r.get(field) is not None else 0.0 for r in rs]
            out[f"spearman_{key}"] = spearman(pr, ms) if len(rs) > 2 else None
            out[f"mae_{key}"] = sum(abs(p - m) for p, m in zip(pr, ms)) / max(1, len(rs))
        return out
    res = {
        **scores(rows),
        "finite": scores([r for r in rows if math.isfinite(r["fp8_gap"])]),
        "noise_ceiling": noise_ceiling(rows) if len(rows) > 2 else None,
        "rows": rows,
        "skipped": skipped,
        "seconds": time.time() - t0,
    }
    json.dump(res, open(os.path.join(a.out, "predict_library.json"), "w"), indent=1)
    md = ["| preset | case | set | FP8 gap | set's gap | predicted (bound) | predicted (signed) | predicted (excess) | measured | ± noise | BF16 FLOPs |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ps = "-" if r["predicted_signed"] is None else f"{r['predicted_signed']:.3f}"
        pe = "-" if r.get("predicted_excess") is None else f"{r['predicted_excess']:.3f}"
        md.append(f"| {r['preset']} | {r['case']} | {r['set']} | {r['fp8_gap']:+.2%} | {r['set_gap']:+.2%} | {r['predicted']:.3f} | {ps} | {pe} | {r['measured']:.3f} | {r['resolution']:.3f} | {r['bf16_flops_share']:.1%} |")
    md.append("")
    n_cases = len({(r["preset"], r["case"]) for r in rows})
    md.append(f"{n_cases} cases measured ({len(skipped)} left out, below); the headline share is predict's (ranked by {', '.join(sorted({str(r['ranked_by']) for r in rows}))})")
    for label, sc in [("every case", res), ("cases whose FP8 run ends finite", res["finite"])]:
        md.append(f"{label}, {sc['cases']} sets: Spearman headline {sc['spearman_headline']:.3f}, bound {sc['spearman_bound']:.3f}, signed {sc['spearman_signed']:.3f}, excess {sc['spearman_excess']:.3f}; "
                  f"mean absolute error headline {sc['mae_headline']:.3f}, bound {sc['mae_bound']:.3f}, signed {sc['mae_signed']:.3f}, excess {sc['mae_excess']:.3f}")
    if res["noise_ceiling"] is not None:
        md.append(f"noise ceiling: two re-measurements of these recoveries, each moved by half its ± noise, rank-correlate at {res['noise_ceiling']:.3f} (median of 400 draws)")
    for s in skipped:
        md.append(f"left out: {s['preset']} {s['case']}: {s.get('error') or 'FP8 gap %+.2f%% under --min-gap' % (100 * s['fp8_gap'])}")
    open(os.path.join(a.out, "predict_library.md"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
