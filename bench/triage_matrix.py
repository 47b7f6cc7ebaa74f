#!/usr/bin/env python3
"""The planted-fault matrix at real size (issue 54): `fp8-analyze triage --predict` on faults planted
at the `seed` (GPT, 12 layers, C 1024) and `llama-small` (Llama, 4 layers, C 256) presets, on the
GPU, and on clean runs of both presets over several seeds. For each case: the verdict (anomaly,
healthy, inconclusive), the culprits, whether they are exactly the planted GEMM, how the verdict
was confirmed (the predicted two-run test or the second seed), the final gap against the noise band,
the runs recorded and the seconds taken.

    python3 bench/triage_matrix.py --bin BIN_DIR --out OUT [--only faults|clean] [--cases f3,c0] \
        [--deadline SECONDS] [--stop-at SECONDS] [--parallel 2] [--device cuda] [--jobs 4]

Rows go to OUT/matrix.jsonl as each case ends (a call cut short keeps what it finished); the table
to OUT/matrix.md. --parallel runs that many triages at once (each with --jobs runs at once: small
presets leave most of a GPU idle, so the seconds of a case then include waiting for the others'
runs). --deadline stops starting cases after that many seconds; --stop-at ends the triages still
running at that many seconds, each recorded as cut short.
"""
import argparse, json, os, shutil, signal, subprocess, tempfile, time

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


def triage_argv(a, d, preset, seed, extra):
    shutil.rmtree(d, ignore_errors=True)
    return [os.path.join(a.bin, "fp8-analyze"), "--json", "triage", "--quiet", "--predict", "--out", d, "--preset", preset, "--seed", str(seed),
            "--steps", str(STEPS[preset]), "--device", a.device, "--jobs", str(a.jobs)] + extra + a.triage_flags.split()


def parse_verdict(out, err):
    try:
        return json.loads(out), None
    except ValueError:
        return None, (err.strip() or out.strip())[-400:]


def row_of(v, secs, err):
    if v is None:
        return {"verdict": "error", "error": err, "seconds": secs}
    noise = v.get("noise") or {}
    pred = v.get("predicted") or {}
    conf = v.get("confirmation")
    return {"verdict": verdict_kind(v), "anomaly": v.get("anomaly"), "culprits": names(v.get("culprits")),
            "band": noise.get("final_gap"), "predicted_held": pred.get("held"), "predicted_recovered": pred.get("recovered"),
            "suspects": names(pred.get("suspects")),
            "each_alone": [{"gemm": names([e["culprit"]])[0], "cures": e.get("cures"), "recovered": e.get("recovered")} for e in pred.get("each_alone") or []],
            "second_seed": None if conf is None else {k: conf.get(k) for k in conf if k != "runs"},
            "runs": len(v.get("runs", [])), "seconds": secs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--only", choices=["faults", "clean"])
    ap.add_argument("--cases", help="comma-separated indices into the faults and the clean runs; f3 or c3 names one list's")
    ap.add_argument("--deadline", type=float, default=1e9, help="start no case after this many seconds")
    ap.add_argument("--stop-at", type=float, default=1e9, help="end the triages still running at this many seconds")
    ap.add_argument("--parallel", type=int, default=1, help="triages run at once")
    ap.add_argument("--triage-flags", default="", help="more flags for every triage (e.g. '--noise-runs 4')")
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
        # "3" picks the fault and the clean run of index 3 (as --only allows); "f3" or "c3" one of them.
        keep = set()
        for tok in a.cases.split(","):
            kinds = {"f": ["fault"], "c": ["clean"]}.get(tok[0], ["fault", "clean"])
            keep |= {(k, int(tok.lstrip("fc"))) for k in kinds}
        todo = [t for t in todo if (t[0], t[1]) in keep]
    def case_of(kind, i, case):
        """The case's row head and its triage command line."""
        d = os.path.join(work, f"{kind}{i:02d}")
        if kind == "fault":
            preset, seed, site, gemm, fault, step = case
            head = {"case": f"fault{i:02d}", "preset": preset, "seed": seed, "fault": f"{site}.{gemm} {fault}@{step}", "planted": f"{site}.{gemm}"}
            return head, triage_argv(a, d, preset, seed, ["--inject", f"site={site},gemm={gemm},kind={fault},step={step}"])
        preset, seed = case
        return {"case": f"clean{i:02d}", "preset": preset, "seed": seed, "fault": "none"}, triage_argv(a, d, preset, seed, [])

    def finish(head, v, secs, err):
        row = {k: x for k, x in head.items() if k != "planted"}
        row.update(row_of(v, secs, err))
        if "planted" in head:
            row["exact"] = row.get("culprits") == [head["planted"]]
        else:
            row["exact"] = row["verdict"] in ("healthy", "inconclusive")
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "matrix.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        shutil.rmtree(os.path.join(work, row["case"]), ignore_errors=True)

    rows = []
    running = []  # (head, Popen, started, stdout file, stderr file)
    while todo or running:
        while todo and len(running) < a.parallel:
            kind, i, case = todo.pop(0)
            if time.time() - started > a.deadline:
                print(f"deadline: {kind} {i} not started", flush=True)
                continue
            head, argv = case_of(kind, i, case)
            fo, fe = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            running.append((head, subprocess.Popen(argv, stdout=fo, stderr=fe, text=True, start_new_session=True), time.time(), fo, fe))
        time.sleep(1)
        for r in list(running):
            head, p, t0, fo, fe = r
            cut = p.poll() is None and time.time() - started > a.stop_at
            if cut:
                os.killpg(p.pid, signal.SIGKILL)  # the triage and the fp8-capture runs it started
                p.wait()
            if p.poll() is None:
                continue
            running.remove(r)
            fo.seek(0)
            fe.seek(0)
            v, err = parse_verdict(fo.read(), fe.read())
            if cut:
                v, err = None, f"cut short at --stop-at {a.stop_at:.0f} s"
            finish(head, v, round(time.time() - t0, 1), err)
    md = ["| case | preset | seed | fault | verdict | culprits | exact | predicted held | band | runs | s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        band = "-" if r.get("band") is None else f"{r['band']:.2%}"
        md.append(f"| {r['case']} | {r['preset']} | {r['seed']} | {r['fault']} | {r['verdict']} | {', '.join(r.get('culprits') or []) or '-'} | "
                  f"{r['exact']} | {r.get('predicted_held')} | {band} | {r.get('runs', '-')} | {r['seconds']} |")
    open(os.path.join(a.out, "matrix.md"), "a").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
