#!/usr/bin/env python3
"""The planted-fault matrix at real size (issue 54): `fp8-analyze triage --predict` on faults planted
at the `seed` (GPT, 12 layers, C 1024) and `llama-small` (Llama, 4 layers, C 256) presets, on the
GPU, and on clean runs of both presets over several seeds. For each case: the verdict (anomaly,
healthy, inconclusive), the culprits, whether they are exactly the planted GEMM, how the verdict
was confirmed (the predicted two-run test or the second seed), the final gap against the noise band,
the runs recorded and the seconds taken.

    python3 bench/triage_matrix.py --bin BIN_DIR --out OUT [--only faults|clean] [--cases 0,3] \
        [--deadline SECONDS] [--device cuda] [--jobs 4]

Rows go to OUT/matrix.jsonl as each case ends (a call cut short keeps what it finished); the table
to OUT/matrix.md. --deadline stops starting cases after that many seconds.
"""
import argparse, json, os, shutil, subprocess, time

STEPS = {"seed": 450, "llama-small": 400}

# (preset, seed, site, gemm, kind, step): none of them the two cases of the issue
# (llama-small layers.2.fc2 dgrad overflow seed 6; seed layers.6.fc1 dgrad overflow seed 3).
FAULTS = [
    ("llama-small", 1, "layers.1.fc1", "fprop", "overflow", 100),
    ("llama-small", 2, "layers.3.qkv", "wgrad", "overflow", 120),
    ("llama-small", 3, "layers.0.fc2", "fprop", "nan", 150),
    ("llama-small", 4, "layers.2.proj", "dgrad", "underflow", 100),
    ("llama-small", 5, "layers.1.qkv", "fprop", "outlier", 100),
    ("llama-small", 7, "layers.3.fc2", "dgrad", "nan", 200),
    ("seed", 1, "layers.2.qkv", "fprop", "overflow", 100),
    ("seed", 2, "layers.9.fc2", "dgrad", "nan", 150),
    ("seed", 4, "layers.4.fc1", "wgrad", "overflow", 120),
    ("seed", 5, "layers.0.proj", "fprop", "underflow", 100),
    ("seed", 6, "layers.7.fc2", "fprop", "outlier", 100),
    ("seed", 7, "layers.11.fc1", "dgrad", "overflow", 150),
]
CLEAN = [(p, s) for p in ("llama-small", "seed") for s in range(4)]


def names(culprits):
    return sorted(f"layers.{c['layer']}.{c['module']}.{c['gemm']}" for c in culprits or [])


def verdict_kind(v):
    if v.get("inconclusive"):
        return "inconclusive"
    if v.get("anomaly"):
        return "anomaly"
    if v.get("mechanisms"):
        return "mechanism"
    return "healthy" if v.get("healthy") else "unknown"


def triage(a, d, preset, seed, extra):
    shutil.rmtree(d, ignore_errors=True)
    argv = [os.path.join(a.bin, "fp8-analyze"), "--json", "triage", "--quiet", "--predict", "--out", d, "--preset", preset, "--seed", str(seed),
            "--steps", str(STEPS[preset]), "--device", a.device, "--jobs", str(a.jobs)] + extra
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True)
    secs = round(time.time() - t0, 1)
    try:
        return json.loads(p.stdout), secs, None
    except ValueError:
        return None, secs, (p.stderr.strip() or p.stdout.strip())[-400:]


def row_of(v, secs, err):
    if v is None:
        return {"verdict": "error", "error": err, "seconds": secs}
    noise = v.get("noise") or {}
    pred = v.get("predicted") or {}
    conf = v.get("confirmation")
    return {"verdict": verdict_kind(v), "anomaly": v.get("anomaly"), "culprits": names(v.get("culprits")),
            "band": noise.get("final_gap"), "predicted_held": pred.get("held"), "predicted_recovered": pred.get("recovered"),
            "suspects": names(pred.get("suspects")), "second_seed": None if conf is None else {k: conf.get(k) for k in conf if k != "runs"},
            "runs": len(v.get("runs", [])), "seconds": secs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--only", choices=["faults", "clean"])
    ap.add_argument("--cases", help="comma-separated indices into the faults (or, with --only clean, the clean runs)")
    ap.add_argument("--deadline", type=float, default=1e9, help="start no case after this many seconds")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = os.path.join(a.out, "runs")
    started = time.time()
    todo = []
    if a.only != "clean":
        todo += [("fault", i, f) for i, f in enumerate(FAULTS)]
    if a.only != "faults":
        todo += [("clean", i, c) for i, c in enumerate(CLEAN)]
    if a.cases:
        keep = {int(i) for i in a.cases.split(",")}
        todo = [t for t in todo if t[1] in keep]
    rows = []
    for kind, i, case in todo:
        if time.time() - started > a.deadline:
            print(f"deadline: {kind} {i} not started", flush=True)
            continue
        if kind == "fault":
            preset, seed, site, gemm, fault, step = case
            planted = f"{site}.{gemm}"
            v, secs, err = triage(a, os.path.join(work, f"fault{i:02d}"), preset, seed, ["--inject", f"site={site},gemm={gemm},kind={fault},step={step}"])
            row = {"case": f"fault{i:02d}", "preset": preset, "seed": seed, "fault": f"{planted} {fault}@{step}", **row_of(v, secs, err)}
            row["exact"] = row.get("culprits") == [planted]
        else:
            preset, seed = case
            v, secs, err = triage(a, os.path.join(work, f"clean{i:02d}"), preset, seed, [])
            row = {"case": f"clean{i:02d}", "preset": preset, "seed": seed, "fault": "none", **row_of(v, secs, err)}
            row["exact"] = row["verdict"] in ("healthy", "inconclusive")
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "matrix.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        shutil.rmtree(os.path.join(work, row["case"]), ignore_errors=True)
    md = ["| case | preset | seed | fault | verdict | culprits | exact | predicted held | band | runs | s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        band = "-" if r.get("band") is None else f"{r['band']:.2%}"
        md.append(f"| {r['case']} | {r['preset']} | {r['seed']} | {r['fault']} | {r['verdict']} | {', '.join(r.get('culprits') or []) or '-'} | "
                  f"{r['exact']} | {r.get('predicted_held')} | {band} | {r.get('runs', '-')} | {r['seconds']} |")
    open(os.path.join(a.out, "matrix.md"), "a").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
