#!/usr/bin/env python3
"""Reads fp8-capture runs (steps/part-*.parquet) for the GPU checks and the benchmark.

  runs.py parity CPU_RUN GPU_RUN [--tol 0.01]   GPU loss within tol (relative) of the CPU's at every step
  runs.py same RUN_A RUN_B                      the two loss columns are bit-identical
  runs.py tables RUN_A RUN_B                    every table (steps, stats, shadow, tensors, events) holds
                                                the same rows, bit for bit, but for wall-clock columns;
                                                a table that differs names its differing columns (with
                                                the largest relative difference of a float column)
  runs.py speed RUN [--skip 10] [--name N] [--peak-mib M]
                                                median and mean step_ms after the first `skip` steps, and
                                                the model TFLOP/s of the median step (dims from run.json)
  runs.py ranks ONE_RANK_RUN RANKS_RUN [--tol 0.02]
                                                a run of several ranks (--dp / --tp) against one rank of
                                                the same seed: every rank records the same loss; the
                                                loss's relative difference at step 1, the largest (and
                                                where), steps over 0.1%, the final loss's (mean of the
                                                last 20 steps), bit-identical or not; and step 1's
                                                activation amaxes reduced over the ranks (max) against
                                                one rank's (how many are bit-identical). Fails when a
                                                step's loss differs by more than tol
  runs.py final RUN                             mean loss of the last 20 steps, and ln V (JSON)
  runs.py flops --arch gpt|llama --vocab V --channels C --ffn F --heads NH [--kv-heads KVH]
                --layers L --batch B --seq T [--tied] [--ms MS]
                                                parameters and model FLOPs per step (TFLOP/s with --ms)
  runs.py peer LOG NAME [--peak-mib M] [dims as for flops]
                                                the RESULT line of torch_tiny.py / torch_llama.py as a
                                                speed row (median_ms = its ms_step); an error row when
                                                the log has none
Exits 1 when a check fails.

Model FLOPs per step (model_flops), the convention of torch_llama.py so that both sides compare:
  6 * (parameters - V*C) * B*T  +  12 * L * B * T^2 * C
the first term is every weight matrix but the token embedding (a lookup), lm_head included, forward
and backward (2 + 4 FLOPs per weight and token); the second is attention's QK^T and AV, forward and
backward, counted over the full T x T square (no halving for the causal mask). `flops_causal` gives
the same with the attention term halved.
"""
import glob
import json
import math
import os
import sys

import pyarrow.parquet as pq


def column_diffs(x, y):
    """Which columns of two tables differ: for floating-point columns of equal length the largest
    relative difference |a - b| / max(|a|, |b|) over rows (NaN where only one side is NaN),
    else just that they differ."""
    import math
    out = {}
    if x.num_rows != y.num_rows or x.column_names != y.column_names:
        return {"shape": f"{x.num_rows} x {x.column_names} vs {y.num_rows} x {y.column_names}"}
    for c in x.column_names:
        a, b = x.column(c), y.column(c)
        if a.equals(b):
            continue
        worst = None
        if str(a.type) in ("double", "float"):
            worst = 0.0
            for u, v in zip(a.to_pylist(), b.to_pylist()):
                if u == v or (u is not None and v is not None and math.isnan(u) and math.isnan(v)):
                    continue
                if u is None or v is None or math.isnan(u) or math.isnan(v):
                    worst = float("nan")
                    break
                worst = max(worst, abs(u - v) / max(abs(u), abs(v)))
        if worst == 0.0:
            continue  # equal but for NaNs in the same rows
        out[c] = "differs" if worst is None else worst
    return out


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


def rank_losses(run):
    """step -> loss of a run of one or several ranks (every rank's rows must agree)."""
    out = {}
    for f in glob.glob(os.path.join(run, "steps", "**", "part-*.parquet"), recursive=True):
        t = pq.read_table(f, columns=["step", "loss"]).to_pydict()
        for s, l in zip(t["step"], t["loss"]):
            if out.setdefault(s, l) != l and not (math.isnan(l) and math.isnan(out[s])):
                sys.exit(f"{run}: step {s}: the ranks record different losses ({out[s]} and {l})")
    if not out:
        sys.exit(f"{run}: no steps parts")
    return out


def step_amaxes(run, step):
    """(layer, module, gemm, role) -> the largest amax over the ranks at `step`, activations and
    gradients only (a tensor-parallel rank's weight shard is not the whole weight)."""
    out = {}
    for f in glob.glob(os.path.join(run, "stats", "**", "part-*.parquet"), recursive=True):
        t = pq.read_table(f, columns=["step", "layer", "module", "gemm", "role", "amax"]).to_pydict()
        for i, s in enumerate(t["step"]):
            if s != step or t["role"][i] == "weight":
                continue
            k = (t["layer"][i], t["module"][i], t["gemm"][i], t["role"][i])
            out[k] = max(out.get(k, float("-inf")), t["amax"][i])
    return out


def ranks_check(one_run, many_run, tol):
    a, b = rank_losses(one_run), rank_losses(many_run)
    steps_ = sorted(set(a) & set(b))
    gap = {s: 0.0 if a[s] == b[s] else abs(b[s] - a[s]) / abs(a[s]) for s in steps_}
    worst = max(steps_, key=lambda s: gap[s])
    tail = steps_[-20:]
    fa, fb = sum(a[s] for s in tail) / len(tail), sum(b[s] for s in tail) / len(tail)
    am1, amn = step_amaxes(one_run, steps_[0]), step_amaxes(many_run, steps_[0])
    shared = sorted(set(am1) & set(amn))
    amax_gap = max((abs(amn[k] - am1[k]) / abs(am1[k]) for k in shared if am1[k] != amn[k]), default=0.0)
    ok = sorted(a) == sorted(b) and gap[worst] <= tol and all(math.isfinite(b[s]) for s in steps_)
    return {"check": "ranks", "run": os.path.basename(many_run.rstrip("/")), "steps": len(steps_),
            "loss_step1": gap[steps_[0]], "loss_largest": gap[worst], "largest_at": worst,
            "steps_over_0.1%": sum(g > 1e-3 for g in gap.values()), "final_loss": abs(fb - fa) / fa,
            "bit_identical": all(a[s] == b[s] for s in steps_),
            "step1_amaxes": len(shared), "step1_amaxes_identical": sum(am1[k] == amn[k] for k in shared),
            "step1_amax_largest": amax_gap, "tol": tol, "pass": ok}


def arg(name, default):
    if name in sys.argv:
        return type(default)(sys.argv[sys.argv.index(name) + 1])
    return default


def n_params(arch, vocab, channels, ffn, heads, kv_heads, layers, tied=False):
    """Parameter count, as capture/src/model/params.rs lays them out (equal to PyTorch's for
    torch_tiny.py's encoder layers and Hugging Face's LlamaForCausalLM)."""
    v, c, f = vocab, channels, ffn
    emb = v * c * (1 if tied else 2)
    if arch == "llama":
        kv = (kv_heads or heads) * (c // heads)
        return emb + c + layers * (2 * c + c * (c + 2 * kv) + c * c + 3 * c * f)
    if arch == "gpt":
        return emb + 2 * c + layers * (4 * c + 3 * c * c + 3 * c + c * c + c + 2 * f * c + f + c)
    raise ValueError(f"unknown arch {arch}")


def model_flops(arch, vocab, channels, ffn, heads, kv_heads, layers, batch, seq, tied=False):
    """Model FLOPs of one training step (forward + backward), torch_llama.py's formula:
    6 * (parameters - V*C) * B*T + 12 * L * B * T^2 * C; the lm_head counts even when tied."""
    p = n_params(arch, vocab, channels, ffn, heads, kv_heads, layers, tied)
    matmul = p - (0 if tied else vocab * channels)
    tokens = batch * seq
    attn = 12 * layers * batch * seq * seq * channels
    return {"params": p, "params_M": round(p / 1e6, 1), "tokens": tokens,
            "flops": 6 * matmul * tokens + attn, "flops_causal": 6 * matmul * tokens + attn // 2}


DIMS = ("arch", "vocab", "channels", "ffn", "heads", "kv_heads", "layers", "batch", "seq")


def dims_from_flags():
    """The dims given as flags (--kv-heads for kv_heads), or None when --vocab is absent."""
    if "--vocab" not in sys.argv:
        return None
    d = {k: arg("--" + k.replace("_", "-"), "" if k == "arch" else 0) for k in DIMS}
    d["arch"] = d["arch"] or "gpt"
    d["tied"] = "--tied" in sys.argv
    missing = [k for k in DIMS if k not in ("arch", "kv_heads") and not d[k]]
    if missing:
        sys.exit("flops: missing " + ", ".join("--" + k for k in missing))
    return d


def with_tflops(row, d, ms):
    """Adds params_M, flops_step and model_tflops (of `ms` per step) to `row`."""
    f = model_flops(**d)
    row.update({"params_M": f["params_M"], "flops_step": f["flops"],
                "model_tflops": round(f["flops"] / (ms / 1e3) / 1e12, 1) if ms else None,
                "model_tflops_causal": round(f["flops_causal"] / (ms / 1e3) / 1e12, 1) if ms else None})
    return row


def run_config(run):
    """run.json's config of a recorded run, or {} when it cannot be read."""
    try:
        return json.load(open(os.path.join(run, "run.json"))).get("config", {})
    except (OSError, ValueError, AttributeError):
        return {}


def dump_every(config):
    """A run config's dump_every (config.record), or 0."""
    try:
        return int(config["record"]["dump_every"])
    except (KeyError, TypeError, ValueError):
        return 0


def run_dims(config):
    """The model dims of a run config (run.json's config.model), or None."""
    try:
        m = config["model"]
        return {"arch": m.get("arch", "gpt"), "vocab": m["vocab"], "channels": m["channels"], "ffn": m["ffn"],
                "heads": m["heads"], "kv_heads": m.get("kv_heads"), "layers": m["layers"], "batch": m["batch"],
                "seq": m["seq"], "tied": bool(m.get("tie_embeddings", False))}
    except (KeyError, TypeError):
        return None


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
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
    if cmd == "ranks":
        r = ranks_check(sys.argv[2], sys.argv[3], arg("--tol", 0.02))
        print(json.dumps(r))
        sys.exit(0 if r["pass"] else 1)
    if cmd == "same":
        a, b = steps(sys.argv[2]), steps(sys.argv[3])
        diff = [x["step"] for x, y in zip(a, b) if x["loss"] != y["loss"]]
        ok = len(a) == len(b) and not diff
        print(json.dumps({"check": "determinism", "steps": len(a), "differing_steps": diff[:10], "pass": ok}))
        sys.exit(0 if ok else 1)
    if cmd == "tables":
        import pyarrow as pa
        res = {}
        ok = True
        for table in ("steps", "stats", "shadow", "tensors", "events"):
            def load(run):
                parts = sorted(glob.glob(os.path.join(run, table, "part-*.parquet")))
                if not parts:
                    return None
                t = pa.concat_tables([pq.read_table(f) for f in parts])
                return t.drop([c for c in t.column_names if c.endswith("_ms") or "time" in c or "wall" in c])
            x, y = load(sys.argv[2]), load(sys.argv[3])
            same = (x is None and y is None) or (x is not None and y is not None and x.equals(y))
            res[table] = {"rows": None if x is None else x.num_rows, "same": same}
            if not same and x is not None and y is not None:
                res[table]["differing"] = column_diffs(x, y)
            ok = ok and same and (table != "steps" or x is not None)
        print(json.dumps({"check": "tables", "tables": res, "pass": ok}))
        sys.exit(0 if ok else 1)
    if cmd == "speed":
        s = steps(sys.argv[2])
        skip = arg("--skip", 10)
        ms = sorted(r["step_ms"] for r in s[skip:])
        if not ms:
            sys.exit(f"{sys.argv[2]}: {len(s)} steps, none after --skip {skip}")
        row = {"run": arg("--name", os.path.basename(sys.argv[2])), "steps": len(s), "median_ms": ms[len(ms) // 2],
               "mean_ms": sum(ms) / len(ms), "tokens": s[0]["tokens"], "final_loss": s[-1]["loss"],
               "window_steps": len(ms)}
        config = run_config(sys.argv[2])
        every = dump_every(config)
        if every:
            # Dump steps among those timed: step 1 and every multiple of dump_every.
            row["window_dumps"] = sum(1 for r in s[skip:] if r["step"] == 1 or r["step"] % every == 0)
        if "--peak-mib" in sys.argv:
            row["peak_mib"] = arg("--peak-mib", 0)
        d = run_dims(config)
        if d:
            with_tflops(row, d, row["median_ms"])
        print(json.dumps(row))
        return
    if cmd == "flops":
        d = dims_from_flags()
        if d is None:
            sys.exit("flops: give the dims (--arch --vocab --channels --ffn --heads [--kv-heads] --layers --batch --seq)")
        f = model_flops(**d)
        ms = arg("--ms", 0.0)
        if ms:
            f["model_tflops"] = round(f["flops"] / (ms / 1e3) / 1e12, 1)
            f["model_tflops_causal"] = round(f["flops_causal"] / (ms / 1e3) / 1e12, 1)
        print(json.dumps({**d, **f}))
        return
    if cmd == "peer":
        log, name = sys.argv[2], sys.argv[3]
        try:
            lines = open(log, errors="replace").read().splitlines()
        except OSError as e:
            lines = [f"no log: {e}"]
        res = [l[len("RESULT "):] for l in lines if l.startswith("RESULT ")]
        if not res:
            tail = next((l for l in reversed(lines) if l.strip()), "no output")
            print(json.dumps({"run": name, "error": tail.strip()[:300]}))
            return
        r = json.loads(res[-1])
        r.update({"run": name, "median_ms": r["ms_step"], "tokens": r.get("tokens", r.get("batch", 0) * r.get("seq", 512))})
        if "--peak-mib" in sys.argv:
            r["peak_mib"] = arg("--peak-mib", 0)
        d = dims_from_flags()
        if d is None and all(k in r for k in ("vocab", "dim", "ffn", "heads", "layers", "batch", "seq")):
            d = {"arch": "llama", "vocab": r["vocab"], "channels": r["dim"], "ffn": r["ffn"], "heads": r["heads"],
                 "kv_heads": r.get("kv_heads"), "layers": r["layers"], "batch": r["batch"], "seq": r["seq"]}
        if d:
            # The peer's own figures, when it prints them, stay beside ours (they must agree).
            for k in ("model_tflops", "params_M"):
                if k in r:
                    r["peer_" + k] = r[k]
            with_tflops(r, d, r["ms_step"])
        print(json.dumps(r))
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
