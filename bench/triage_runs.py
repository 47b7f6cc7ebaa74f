#!/usr/bin/env python3
"""Runs `fp8-analyze triage` on the scenario and planted-fault library with and without
`--predict`, and compares what each named and how many runs it recorded (CPU).

    python3 bench/triage_runs.py --bin $CARGO_TARGET_DIR/release --out bench/results/triage-runs
    python3 bench/triage_runs.py --bin BIN --out OUT --predict-only --parallel 4   # 4 triages at once
"""
import argparse, concurrent.futures, json, os, shutil, subprocess, threading, time

CASES = [
    ("tiny", "l1.fc2.dgrad overflow@100", ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]),
    ("tiny", "l0.fc1.fprop overflow@100", ["--inject", "site=layers.0.fc1,gemm=fprop,kind=overflow,step=100"]),
    ("llama-tiny", "l1.fc2.dgrad overflow@100", ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100"]),
    ("llama-tiny", "l0.fc1.fprop overflow@100", ["--inject", "site=layers.0.fc1,gemm=fprop,kind=overflow,step=100"]),
    ("tiny", "spike", ["--scenario", "spike"]),
    ("tiny", "drift", ["--scenario", "drift"]),
    ("tiny", "nan", ["--scenario", "nan"]),
    ("tiny", "l1.fc2.dgrad nan@150 (seed 2)", ["--seed", "2", "--inject", "site=layers.1.fc2,gemm=dgrad,kind=nan,step=150"]),
    ("llama-tiny", "l0.fc2.fprop nan@120", ["--inject", "site=layers.0.fc2,gemm=fprop,kind=nan,step=120"]),
    ("tiny", "l1.fc2.dgrad + l0.fc1.dgrad overflow@100",
     ["--inject", "site=layers.1.fc2,gemm=dgrad,kind=overflow,step=100", "--inject", "site=layers.0.fc1,gemm=dgrad,kind=overflow,step=100"]),
]


def names(v):
    return [f"layers.{c['layer']}.{c['module']}.{c['gemm']}" for c in v.get("culprits", [])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--cases", default=None, help="comma-separated indices into the library")
    ap.add_argument("--predict-only", action="store_true", help="skip the full method's runs")
    ap.add_argument("--parallel", type=int, default=1, help="triages at once (each then gets --jobs cores / N)")
    ap.add_argument("--jobs", type=int, default=0, help="runs at once within a triage (default: cores / --parallel)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = a.work or os.path.join(a.out, "runs")
    picked = list(enumerate(CASES)) if a.cases is None else [(int(i), CASES[int(i)]) for i in a.cases.split(",")]
    jobs = a.jobs or max(1, (os.cpu_count() or 1) // max(1, a.parallel))
    env = dict(os.environ, RAYON_NUM_THREADS=str(max(1, jobs // 2))) if a.parallel > 1 else None
    lock = threading.Lock()

    def one(c):
        ci, (preset, label, flags) = c
        row = {"preset": preset, "case": label}
        modes = (("predict", ["--predict"]),) if a.predict_only else (("full", []), ("predict", ["--predict"]))
        for mode, extra in modes:
            d = os.path.join(work, f"case{ci:02d}-{mode}")
            shutil.rmtree(d, ignore_errors=True)
            t0 = time.time()
            jobs_flag = ["--jobs", str(jobs)] if a.parallel > 1 or a.jobs else []
            p = subprocess.run([os.path.join(a.bin, "fp8-analyze"), "--json", "triage", "--out", d, "--preset", preset, "--device", "cpu"] + jobs_flag + flags + extra,
                               capture_output=True, text=True, env=env)
            secs = time.time() - t0
            try:
                v = json.loads(p.stdout)
            except ValueError:
                with lock:
                    print(f"{preset} {label} {mode}: failed: {p.stderr.strip()[-300:]}", flush=True)
                continue
            pred = v.get("predicted") or {}
            row[mode] = {"anomaly": v.get("anomaly"), "culprits": names(v), "runs": len(v.get("runs", [])), "seconds": round(secs),
                         "predicted_held": pred.get("held"), "suspects": len(pred.get("suspects") or []),
                         "each_alone_cures": [e.get("cures") for e in pred.get("each_alone") or []]}
            with lock:
                print(f"{preset} {label} {mode}: {row[mode]}", flush=True)
            shutil.rmtree(d, ignore_errors=True)
        return row

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        rows = list(pool.map(one, picked))
    json.dump(rows, open(os.path.join(a.out, "triage_runs.json"), "w"), indent=1)
    md = ["| preset | case | full: culprits | runs | --predict: culprits | runs | predicted held |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        f, p = r.get("full", {}), r.get("predict", {})
        md.append(f"| {r['preset']} | {r['case']} | {', '.join(f.get('culprits', [])) or '-'} | {f.get('runs', '-')} | "
                  f"{', '.join(p.get('culprits', [])) or '-'} | {p.get('runs', '-')} | {p.get('predicted_held')} |")
    open(os.path.join(a.out, "triage_runs.md"), "w").write("\n".join(md) + "\n")
    print("\n".join(md))
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
