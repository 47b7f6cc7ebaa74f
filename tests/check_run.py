"""Independent check of an fp8scope run directory with pyarrow and ml_dtypes.

Reads every closed Parquet part of every table, checks the fp8scope metadata (table name, schema
version), the documented columns and types, the row counts against run.json and against what the
configuration implies, and re-casts every dumped FP8 value with ml_dtypes (values * scale, clipped
to the format's max, round-to-nearest-even) to compare byte for byte with the recorded FP8 bytes (NaN: 0x7F, as Hopper's
saturating cast gives; ml_dtypes keeps the sign, so NaN is mapped here). Where a quantized operand
was dumped whole (--dump-max-elems at least its size), its per-channel statistics (amax_channel,
top_channel_sq_frac) are recomputed from the dumped values with numpy and compared with every stats
row of that tensor (runs without --inject only: a planted outlier changes the cast, not the dump).

Usage: python3 check_run.py RUN_DIR [--allow-incomplete]
Prints one summary line; exits 1 with the reason on the first mismatch.
"""
import glob
import json
import os
import re
import sys

import ml_dtypes
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = "3"
COLUMNS = {
    "steps": [("step", pa.int64()), ("loss", pa.float64()), ("grad_norm", pa.float64()), ("lr", pa.float64()),
              ("tokens", pa.int64()), ("step_ms", pa.float64()), ("loss_is_finite", pa.bool_()),
              ("nonfinite_tensors", pa.int32()), ("rank", pa.int32())],
    "stats": [("step", pa.int64()), ("layer", pa.int32()), ("module", pa.string()), ("gemm", pa.string()),
              ("role", pa.string()), ("format", pa.string()), ("scale", pa.float32()), ("amax", pa.float32()),
              ("amax_used", pa.float32()), ("numel", pa.int64()), ("underflow_frac", pa.float64()),
              ("saturated_frac", pa.float64()), ("nan_count", pa.int64()), ("inf_count", pa.int64()),
              ("zero_frac", pa.float64()), ("min", pa.float32()), ("max", pa.float32()), ("mean", pa.float64()),
              ("std", pa.float64()), ("dynamic_range_log2", pa.float64()), ("quant_mse", pa.float64()),
              ("quant_cos", pa.float64()), ("amax_channel", pa.int32()), ("top_channel_sq_frac", pa.float64()),
              ("rank", pa.int32()), ("quant_bias", pa.float64()),
              ("flip_frac", pa.float64()), ("flip_ratio", pa.float64()), ("block_count", pa.int64()),
              ("block_scale_log2_mean", pa.float64()), ("block_scale_log2_std", pa.float64()),
              ("block_scale_log2_min", pa.float64()), ("block_scale_log2_max", pa.float64()),
              ("block_scale_saturated_frac", pa.float64()), ("block_scale_flushed_frac", pa.float64()),
              ("block_scale_log2_hist", pa.list_(pa.int64()))],
    "tensors": [("step", pa.int64()), ("layer", pa.int32()), ("module", pa.string()), ("role", pa.string()),
                ("gemm", pa.string()), ("format", pa.string()), ("shape", pa.list_(pa.int64())),
                ("numel", pa.int64()), ("offset", pa.int64()), ("stride", pa.int64()),
                ("values", pa.list_(pa.float32())), ("fp8", pa.binary()), ("scale", pa.float32()),
                ("block_scales", pa.list_(pa.float32())), ("block_rows", pa.uint32()), ("block_cols", pa.uint32()),
                ("rank", pa.int32())],
    "events": [("step", pa.int64()), ("kind", pa.string()), ("layer", pa.int32()), ("module", pa.string()),
               ("gemm", pa.string()), ("role", pa.string()), ("value", pa.float64()), ("message", pa.string()),
               ("rank", pa.int32())],
    "shadow": [("step", pa.int64()), ("layer", pa.int32()), ("module", pa.string()), ("gemm", pa.string()),
               ("numel", pa.int64()), ("cosine", pa.float64()), ("mse", pa.float64()), ("rel_l2", pa.float64()),
               ("max_abs_diff", pa.float64()), ("rank", pa.int32()), ("dual_inner", pa.float64()),
               ("dual_norm", pa.float64())],
    "extra_stats": [("step", pa.int64()), ("rank", pa.int32()), ("layer", pa.int32()), ("module", pa.string()),
                    ("tensor", pa.string()), ("stat", pa.string()), ("value", pa.float64())],
    "casts": [("step", pa.int64()), ("rank", pa.int32()), ("layer", pa.int32()), ("module", pa.string()),
              ("gemm", pa.string()), ("role", pa.string()), ("source", pa.string()), ("format", pa.string()),
              ("scale", pa.float32()), ("amax_local", pa.float32()), ("amax_used", pa.float32()),
              ("numel", pa.int64()), ("digest", pa.int64()), ("audit_checked", pa.int64()),
              ("audit_mismatched", pa.int64()), ("master_checked", pa.int64()), ("master_mismatched", pa.int64()),
              ("master_changed", pa.bool_()), ("forward_changed", pa.bool_())],
}
FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}
MODULES = ["qkv", "proj", "fc1", "fc2"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def read_table(run, name):
    parts = sorted(glob.glob(os.path.join(run, name, "part-*.parquet")))
    tables = []
    for p in parts:
        f = pq.ParquetFile(p)
        meta = f.metadata.metadata or {}
        if meta.get(b"fp8scope.table") != name.encode():
            fail(f"{p}: table metadata {meta.get(b'fp8scope.table')!r}, expected {name}")
        if meta.get(b"fp8scope.schema_version") != SCHEMA_VERSION.encode():
            fail(f"{p}: schema version {meta.get(b'fp8scope.schema_version')!r}")
        t = f.read()
        got = [(fld.name, fld.type) for fld in t.schema]
        want = COLUMNS[name]
        if [g[0] for g in got] != [w[0] for w in want]:
            fail(f"{p}: columns {[g[0] for g in got]} != documented {[w[0] for w in want]}")
        for (gn, gt), (_, wt) in zip(got, want):
            if not gt.equals(wt):
                fail(f"{p}: column {gn} has type {gt}, documented {wt}")
        tables.append(t)
    return pa.concat_tables(tables) if tables else None, len(parts)


def recast(values, scale_per_elem, fmt):
    dtype, mx = FORMATS[fmt]
    x = (values.astype(np.float32) * scale_per_elem.astype(np.float32)).astype(np.float32)
    nan = np.isnan(x)
    x = np.clip(np.where(nan, 0, x), -mx, mx).astype(np.float32)
    out = x.astype(dtype).view(np.uint8).copy()
    out[nan] = 0x7F  # saturating hardware casts (cvt.rn.satfinite) give 0x7F for every NaN
    return out


def channel_stats(values, rows, cols):
    """(amax_channel, top_channel_sq_frac) of a whole rows x cols tensor, as schemas/README.md defines
    them: over finite values; the lowest channel on ties; K = max(1, cols // 100) top channels."""
    x = np.asarray(values, dtype=np.float64).reshape(rows, cols)
    fin = np.isfinite(x)
    if not fin.any():
        return None, None
    colmax = np.where(fin, np.abs(x), -np.inf).max(axis=0)
    channel = int(np.argmax(colmax))  # the first (lowest) channel among equal maxima
    sq = np.where(fin, x, 0.0) ** 2
    per = sq.sum(axis=0)
    total = per.sum()
    if total == 0:
        return channel, None
    k = max(1, cols // 100)
    return channel, float(np.sort(per)[::-1][:k].sum() / total)


def check_shadow_bound(data):
    """Every signed shadow effect |<delta, dual>| is at most ||delta||·||dual||, ||delta||^2 = mse·numel
    (Cauchy-Schwarz, with a relative slack for the f64 sums). Returns the rows checked."""
    t = data.get("shadow")
    if t is None or t.num_rows == 0:
        return 0
    rows = 0
    for r in t.to_pylist():
        inner, norm = r["dual_inner"], r["dual_norm"]
        if inner is None or norm is None or not np.isfinite(inner):
            continue
        bound = np.sqrt(max(r["mse"], 0.0) * r["numel"]) * norm
        if abs(inner) > bound * (1 + 1e-9) + 1e-30:
            fail(f"shadow: step {r['step']} layers.{r['layer']}.{r['module']}.{r['gemm']}: |dual_inner| {abs(inner)!r} > bound {bound!r}")
        rows += 1
    return rows


def check_quant_bias(data):
    """Every stats row with a quantization error has its bias, and |bias| = |<x, e>| / ||x||^2 is at
    most ||e|| / ||x|| = sqrt(quant_mse / mean(x^2)) (Cauchy-Schwarz; operands without NaN / Inf,
    where the moments and the error cover the same elements). Returns the rows checked."""
    stats = data["stats"]
    if stats is None:
        return 0
    rows = 0
    for r in stats.select(["step", "layer", "module", "gemm", "role", "quant_mse", "quant_bias", "mean", "std",
                           "nan_count", "inf_count"]).to_pylist():
        if r["quant_mse"] is None:
            if r["quant_bias"] is not None:
                fail(f"stats: step {r['step']} layers.{r['layer']}.{r['module']}.{r['gemm']}.{r['role']}: a bias without an error")
            continue
        if r["quant_bias"] is None:
            fail(f"stats: step {r['step']} layers.{r['layer']}.{r['module']}.{r['gemm']}.{r['role']}: quant_mse without quant_bias")
        if r["nan_count"] or r["inf_count"]:
            continue
        ms = r["std"] ** 2 + r["mean"] ** 2
        if ms == 0:
            continue
        bound = np.sqrt(r["quant_mse"] / ms)
        if abs(r["quant_bias"]) > bound * (1 + 1e-6) + 1e-12:
            fail(f"stats: step {r['step']} layers.{r['layer']}.{r['module']}.{r['gemm']}.{r['role']}: "
                 f"|quant_bias| {abs(r['quant_bias'])!r} > bound {bound!r}")
        rows += 1
    return rows


def check_weight_motion(data):
    """flip_frac and flip_ratio are set on fprop weight rows only, together (but for a weight that
    did not move), flip_frac within [0, 1] and flip_ratio >= 0. Returns the rows that have them."""
    stats = data["stats"]
    if stats is None or "flip_frac" not in stats.column_names:
        return 0
    rows = 0
    for r in stats.select(["step", "layer", "module", "gemm", "role", "flip_frac", "flip_ratio"]).to_pylist():
        where = f"stats: step {r['step']} layers.{r['layer']}.{r['module']}.{r['gemm']}.{r['role']}"
        if r["flip_frac"] is None:
            if r["flip_ratio"] is not None:
                fail(f"{where}: a flip ratio without a flip share")
            continue
        if (r["gemm"], r["role"]) != ("fprop", "weight"):
            fail(f"{where}: weight motion on an operand that is not an fprop weight")
        if not 0.0 <= r["flip_frac"] <= 1.0 or (r["flip_ratio"] is not None and r["flip_ratio"] < 0.0):
            fail(f"{where}: flip_frac {r['flip_frac']!r}, flip_ratio {r['flip_ratio']!r}")
        rows += 1
    return rows


def check_channels(data, cfg):
    """Every stats row has an amax channel; whole dumps agree with the stats. Returns tensors checked."""
    stats = data["stats"]
    if stats is None:
        return 0
    nulls = stats.column("amax_channel").null_count
    if nulls:
        fail(f"stats: amax_channel is null in {nulls} rows (every recorded operand has finite values here)")
    t = data["tensors"]
    if t is None or cfg["injections"]:
        return 0
    want = {}
    for r in stats.select(["step", "layer", "module", "role", "amax_channel", "top_channel_sq_frac"]).to_pylist():
        want.setdefault((r["step"], r["layer"], r["module"], r["role"]), []).append((r["amax_channel"], r["top_channel_sq_frac"]))
    checked = 0
    cols_needed = ["step", "layer", "module", "role", "shape", "numel", "offset", "stride", "values"]
    for row in t.select(cols_needed).to_pylist():
        key = (row["step"], row["layer"], row["module"], row["role"])
        if key not in want or row["stride"] != 1 or row["offset"] != 0 or len(row["values"]) != row["numel"]:
            continue
        rows_, cols = row["shape"]
        ch, share = channel_stats(row["values"], rows_, cols)
        for got_ch, got_share in want[key]:
            where = f"step {key[0]} layers.{key[1]}.{key[2]}.{key[3]}"
            if got_ch != ch:
                fail(f"{where}: amax_channel {got_ch}, numpy on the dump says {ch}")
            if (share is None) != (got_share is None) or (share is not None and abs(got_share - share) > 1e-9 * share):
                fail(f"{where}: top_channel_sq_frac {got_share}, numpy on the dump says {share}")
        checked += 1
    return checked


def check_block_scales(data):
    """Block-scaled casts: every dumped operand's block scales (its tensors row keeps every tile's
    encode scale) give, with numpy in f64, the block_count and the log2 mean, std, min, max and
    histogram of the decode scales (1 / scale) its stats row holds; the saturated and flushed
    shares lie in [0, 1]. Returns the rows checked."""
    stats, t = data["stats"], data["tensors"]
    if stats is None:
        return 0
    cols = ["step", "layer", "module", "gemm", "role", "block_count", "block_scale_log2_mean", "block_scale_log2_std",
            "block_scale_log2_min", "block_scale_log2_max", "block_scale_saturated_frac", "block_scale_flushed_frac",
            "block_scale_log2_hist"]
    rows = {(r["step"], r["layer"], r["module"], r["gemm"], r["role"]): r
            for r in stats.select(cols).to_pylist() if r["block_count"] is not None}
    for r in rows.values():
        for k in ("block_scale_saturated_frac", "block_scale_flushed_frac"):
            if not 0.0 <= r[k] <= 1.0:
                fail(f"stats step {r['step']} layers.{r['layer']}.{r['module']}.{r['gemm']}.{r['role']}: {k} {r[k]!r}")
    checked = 0
    for row in ([] if t is None else t.to_pylist()):
        key = (row["step"], row["layer"], row["module"], row["gemm"], row["role"])
        if row["block_scales"] is None or key not in rows:
            continue
        r = rows[key]
        where = f"step {key[0]} layers.{key[1]}.{key[2]}.{key[3]}.{key[4]}"
        dec = 1.0 / np.array(row["block_scales"], dtype=np.float64)
        if len(dec) != r["block_count"]:
            fail(f"{where}: block_count {r['block_count']}, the dump keeps {len(dec)} block scales")
        lg = np.log2(dec[(dec > 0) & np.isfinite(dec)])
        want = [lg.mean(), lg.std(), lg.min(), lg.max()]
        got = [r["block_scale_log2_mean"], r["block_scale_log2_std"], r["block_scale_log2_min"], r["block_scale_log2_max"]]
        if not np.allclose(got, want, rtol=1e-9, atol=1e-9):
            fail(f"{where}: block scale log2 mean/std/min/max {got}, numpy on the dump says {want}")
        lo = np.floor(lg.min())
        hist = np.bincount((np.floor(lg) - lo).astype(np.int64)).tolist()
        if hist != r["block_scale_log2_hist"]:
            fail(f"{where}: block scale histogram {r['block_scale_log2_hist']}, numpy on the dump says {hist}")
        checked += 1
    return checked


def main():
    run = sys.argv[1]
    allow_incomplete = "--allow-incomplete" in sys.argv
    m = json.load(open(os.path.join(run, "run.json")))
    cfg = m["config"]
    counts = {}
    data = {}
    for name in COLUMNS:
        t, nparts = read_table(run, name)
        data[name] = t
        counts[name] = 0 if t is None else t.num_rows
        if counts[name] != m["rows"][name] and not allow_incomplete:
            fail(f"{name}: {counts[name]} rows in parts, manifest says {m['rows'][name]}")
    if m.get("source", "fp8-capture") != "fp8-capture":
        fail(f"source {m.get('source')!r}: this checker knows fp8-capture runs only")
    st = data["stats"]
    if st is not None and st.column("rank").null_count != st.num_rows:
        fail("stats: an fp8-capture run leaves rank null")
    done = m["steps_completed"]
    if not allow_incomplete:
        if m["status"] not in ("completed", "diverged"):
            fail(f"status {m['status']}")
        if counts["steps"] != done:
            fail(f"steps: {counts['steps']} rows for {done} steps")
        steps = data["steps"].column("step").to_pylist()
        if steps != list(range(1, done + 1)):
            fail("steps are not 1..N in order")
        # stats: every GEMM operand at every stats step
        rec = cfg["record"]
        L = cfg["model"]["layers"]
        se = rec["stats_every"]
        stat_steps = [s for s in range(1, done + 1) if se > 0 and (s == 1 or s % se == 0)]
        if counts["stats"] != len(stat_steps) * L * 4 * 3 * 2:
            fail(f"stats: {counts['stats']} rows, expected {len(stat_steps)} steps x {L * 24}")
        de = rec["dump_every"]
        dump_steps = [s for s in range(1, done + 1) if de > 0 and (s == 1 or s % de == 0)]
        sites = [f"layers.{l}.{mname}" for l in range(L) for mname in MODULES
                 if re.fullmatch(rec["dump_layers"], f"layers.{l}.{mname}")]
        want_tensors = len(dump_steps) * len(sites) * len(rec["dump_roles"])
        if counts["tensors"] != want_tensors:
            fail(f"tensors: {counts['tensors']} rows, expected {want_tensors}")
    # FP8 bytes against ml_dtypes
    checked = matched = 0
    t = data["tensors"]
    if t is not None:
        for row in t.to_pylist():
            if row["fp8"] is None:
                continue
            vals = np.array(row["values"], dtype=np.float32)
            got = np.frombuffer(row["fp8"], dtype=np.uint8)
            if row["scale"] is not None:
                scales = np.full(vals.shape, row["scale"], dtype=np.float32)
            else:
                rows_, cols = row["shape"]
                tr, tc = row["block_rows"], row["block_cols"]
                tiles_per_row = -(-cols // tc)
                idx = row["offset"] + row["stride"] * np.arange(len(vals))
                r, c = idx // cols, idx % cols
                bs = np.array(row["block_scales"], dtype=np.float32)
                scales = bs[(r // tr) * tiles_per_row + c // tc]
            want = recast(vals, scales, row["format"])
            checked += len(vals)
            matched += int((want == got).sum())
            if not (want == got).all():
                i = int(np.argmax(want != got))
                fail(f"fp8 bytes differ at step {row['step']} layers.{row['layer']}.{row['module']}.{row['role']} "
                     f"element {i}: value {vals[i]!r} scale {scales[i]!r} -> ml_dtypes {want[i]:#04x}, recorded {got[i]:#04x}")
    channels = check_channels(data, cfg)
    signed = check_shadow_bound(data)
    biases = check_quant_bias(data)
    motions = check_weight_motion(data)
    blocks = check_block_scales(data)
    print(f"OK {os.path.basename(run)}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; fp8 bytes matched {matched} of {checked}; channel statistics matched on {channels} whole dumps"
          + f"; {signed} signed shadow effects within their Cauchy-Schwarz bound"
          + f"; {biases} quantization biases within theirs"
          + f"; {motions} weight motions on fprop weights only"
          + f"; {blocks} block-scale summaries matched on their dumps")


if __name__ == "__main__":
    main()
