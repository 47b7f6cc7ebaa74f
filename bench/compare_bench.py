"""Benchmark of `fp8-analyze compare` against a plain pyarrow + numpy script on the same two runs.

Writes two synthetic runs whose tensors tables hold about SIZE_GB of f32 values each (run B =
run A + small noise, so every metric is non-trivial), through the documented schema, with valid
manifests taken from a real 1-step fp8-capture run. Then times:
  1. fp8-analyze compare A --baseline B --json   (peak RSS via /usr/bin/time or psutil)
  2. the numpy reference below, which computes the same metrics per aligned tensor in f64
and prints one table: seconds, GB/s of floats (both runs counted), peak RSS, the ratio; and checks
that both agree to 1e-9 relative on every metric.

Usage: python3 bench/compare_bench.py [--size-gb 2] [--workdir DIR] [--bin-dir target/release]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROLES = ["activation", "weight", "gradient", "output", "dgrad", "wgrad"]
MODULES = ["qkv", "proj", "fc1", "fc2"]
TENSOR_SCHEMA = pa.schema([
    ("step", pa.int64()), ("layer", pa.int32()), ("module", pa.string()), ("role", pa.string()),
    ("gemm", pa.string()), ("format", pa.string()), ("shape", pa.list_(pa.int64())), ("numel", pa.int64()),
    ("offset", pa.int64()), ("stride", pa.int64()), ("values", pa.list_(pa.float32())), ("fp8", pa.binary()),
    ("scale", pa.float32()), ("block_scales", pa.list_(pa.float32())), ("block_rows", pa.uint32()),
    ("block_cols", pa.uint32()),
])


def write_run(template_dir, out, elems, steps, layers, noise_seed, base_seed):
    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(template_dir, out, ignore=shutil.ignore_patterns("tensors", "stats", "shadow", "events"))
    m = json.load(open(os.path.join(out, "run.json")))
    m["name"] = os.path.basename(out)
    m["config"]["record"]["dump_every"] = 1
    m["config"]["record"]["dump_max_elems"] = elems
    os.makedirs(os.path.join(out, "tensors"))
    meta = {b"fp8scope.schema_version": b"1", b"fp8scope.table": b"tensors"}
    rows = 0
    rng_base = np.random.default_rng(base_seed)
    rng_noise = np.random.default_rng(noise_seed)
    for step in range(1, steps + 1):
        cols = {k: [] for k in TENSOR_SCHEMA.names}
        for layer in range(layers):
            for module in MODULES:
                for role in ROLES:
                    v = rng_base.standard_normal(elems, dtype=np.float32)
                    if noise_seed is not None:
                        v = v + np.float32(0.01 * (1 + layer)) * rng_noise.standard_normal(elems, dtype=np.float32)
                    cols["step"].append(step); cols["layer"].append(layer); cols["module"].append(module)
                    cols["role"].append(role); cols["gemm"].append(None); cols["format"].append(None)
                    cols["shape"].append([elems // 256, 256]); cols["numel"].append(elems); cols["offset"].append(0)
                    cols["stride"].append(1); cols["values"].append(v); cols["fp8"].append(None)
                    cols["scale"].append(None); cols["block_scales"].append(None)
                    cols["block_rows"].append(None); cols["block_cols"].append(None)
                    rows += 1
        arrays = []
        for f in TENSOR_SCHEMA:
            if f.name == "values":
                flat = np.concatenate(cols["values"])
                offsets = np.arange(0, len(flat) + 1, elems, dtype=np.int32)
                arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)))
            else:
                arrays.append(pa.array(cols[f.name], type=f.type))
        table = pa.Table.from_arrays(arrays, schema=TENSOR_SCHEMA.with_metadata(meta))
        pq.write_table(table, os.path.join(out, "tensors", f"part-{step - 1:05d}.parquet"), compression="snappy")
    m["rows"]["tensors"] = rows
    json.dump(m, open(os.path.join(out, "run.json"), "w"), indent=2)
    return rows


def numpy_compare(a_dir, b_dir):
    """The reference: read both runs' tensors with pyarrow, align by key, metrics in f64."""
    out = []
    parts_a = sorted(os.listdir(os.path.join(a_dir, "tensors")))
    for p in parts_a:
        ta = pq.read_table(os.path.join(a_dir, "tensors", p), columns=["step", "layer", "module", "role", "offset", "values"])
        tb = pq.read_table(os.path.join(b_dir, "tensors", p), columns=["step", "layer", "module", "role", "offset", "values"])
        va = ta.column("values").combine_chunks()
        vb = tb.column("values").combine_chunks()
        keys = zip(*(ta.column(c).to_pylist() for c in ["step", "layer", "module", "role"]))
        for i, key in enumerate(keys):
            a = va[i].values.to_numpy().astype(np.float64)
            b = vb[i].values.to_numpy().astype(np.float64)
            d = a - b
            dd, ab, aa, bb = d @ d, a @ b, a @ a, b @ b
            out.append({"step": key[0], "layer": key[1], "module": key[2], "role": key[3],
                        "cosine": ab / np.sqrt(aa * bb), "mse": dd / len(a), "rel_l2": np.sqrt(dd / bb),
                        "sqnr_db": 10 * np.log10(bb / dd), "max_abs_diff": float(np.abs(d).max())})
    return out


def peak_rss_of(cmd):
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed: {p.stderr.strip()[-500:]}")
    rss_kb = int(p.stderr.strip().splitlines()[-1])
    return secs, rss_kb / 1024, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--workdir", default="/tmp/fp8scope-compare-bench")
    ap.add_argument("--bin-dir", default=os.environ.get("FP8SCOPE_BIN", "target/release"))
    ap.add_argument("--keep", action="store_true", help="reuse runs already written in --workdir")
    ap.add_argument("--reference", nargs=2, metavar=("RUN", "BASELINE"),
                    help="only run the pyarrow + numpy reference and print its JSON")
    a = ap.parse_args()
    if a.reference:
        print(json.dumps(numpy_compare(*a.reference)))
        return
    cap, ana = os.path.join(a.bin_dir, "fp8-capture"), os.path.join(a.bin_dir, "fp8-analyze")
    os.makedirs(a.workdir, exist_ok=True)
    tmpl = os.path.join(a.workdir, "template")
    layers, elems = 4, 1 << 18
    per_step = layers * len(MODULES) * len(ROLES) * elems * 4
    steps = max(1, round(a.size_gb * 1e9 / per_step))
    ra, rb = os.path.join(a.workdir, "run-a"), os.path.join(a.workdir, "run-b")
    if not (a.keep and os.path.exists(rb)):
        if os.path.exists(tmpl):
            shutil.rmtree(tmpl)
        subprocess.run([cap, "train", "--preset", "tiny", "--layers", str(layers), "--steps", "1", "--quiet",
                        "--out", tmpl], check=True)
        t0 = time.perf_counter()
        write_run(tmpl, ra, elems, steps, layers, noise_seed=1, base_seed=7)
        write_run(tmpl, rb, elems, steps, layers, noise_seed=None, base_seed=7)
        print(f"wrote 2 runs x {steps * per_step / 1e9:.2f} GB of f32 in {time.perf_counter() - t0:.0f} s", flush=True)
    gb = 2 * steps * per_step / 1e9
    subprocess.run(["sh", "-c", f"cat {ra}/tensors/* {rb}/tensors/* > /dev/null"])  # page cache, both
    s_ours, rss_ours, out = peak_rss_of([ana, "compare", ra, "--baseline", rb, "--json"])
    s_np, rss_np, ref_out = peak_rss_of([sys.executable, __file__, "--reference", ra, rb])
    ref = json.loads(ref_out)
    ours = json.loads(out)
    rows = ours["tensors"]
    by_key = {(r["step"], r["layer"], r["module"], r["role"]): r for r in rows}
    worst = 0.0
    for r in ref:
        o = by_key[(r["step"], r["layer"], r["module"], r["role"])]
        for k in ["cosine", "mse", "rel_l2", "sqnr_db", "max_abs_diff"]:
            worst = max(worst, abs(o[k] - r[k]) / max(abs(r[k]), 1e-300))
    print()
    print(f"| implementation | seconds | GB/s of floats | peak RSS (MiB) |")
    print(f"| --- | --- | --- | --- |")
    print(f"| fp8-analyze compare | {s_ours:.2f} | {gb / s_ours:.2f} | {rss_ours:.0f} |")
    print(f"| pyarrow + numpy | {s_np:.2f} | {gb / s_np:.2f} | {rss_np:.0f} |")
    print(f"speed-up {s_np / s_ours:.2f}x over {gb:.2f} GB of floats ({len(ref)} tensor pairs); "
          f"worst relative difference between the two: {worst:.2e}")


if __name__ == "__main__":
    main()
