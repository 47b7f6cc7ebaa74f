#!/usr/bin/env python3
"""The table and the verdicts of bench/speed.sh: reads its rows (OUT/speed.jsonl, one JSON object a
run, as runs.py speed / peer write them) and writes OUT/benchmarks_rows.md, a Markdown table of the
runs and one line per speed target (bench/BENCHMARKS.md) with its ratio and verdict.

Usage: bench/speed_summary.py SPEED_JSONL OUT_MD

A file gpu.txt beside SPEED_JSONL (speed.sh writes nvidia-smi's name and driver of the card there)
heads the table: "GPU: <its line>".

A target measured once gets "met" or "missed". The statistics cost (delayed scaling with statistics
every step against none) and the FP8 speed-up (our bf16 against delayed) move by a few percent
between runs, as much as their targets' margins, so speed.sh repeats those runs STATS_ROUNDS times,
interleaved (runs NAME-rK): their lines give the median ratio over every pair and their range, and
the verdict is "met" when every pair meets the target, "missed" when none does, and "unsettled"
otherwise. The repeats' rows stay out of the table unless they failed."""
import json
import os
import re
import statistics
import sys

if len(sys.argv) != 3:
    sys.exit("usage: bench/speed_summary.py SPEED_JSONL OUT_MD")
try:
    with open(sys.argv[1]) as f:
        rows = [json.loads(l) for l in f if l.strip()]
except OSError as e:
    sys.exit(f"speed_summary.py: cannot read {sys.argv[1]}: {e.strerror}")
except json.JSONDecodeError as e:
    sys.exit(f"speed_summary.py: {sys.argv[1]} holds a line that is not JSON ({e})")
REPEAT = re.compile(r"-r[0-9]+$")
by = {r["run"]: r for r in rows}
def val(n, k): return by.get(n, {}).get(k)
def f(x, nd=2): return "" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))
try:
    gpu = open(os.path.join(os.path.dirname(sys.argv[1]), "gpu.txt")).read().strip()
except OSError:
    gpu = ""
out = [f"GPU: {gpu}", ""] if gpu else []
out += ["| run | ms/step (median) | ms/step (mean) | tokens/step | model TFLOP/s | peak GPU MiB | note |",
       "| --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    if REPEAT.search(r["run"]) and "error" not in r:
        continue
    note = r.get("error", "")
    if "peer_model_tflops" in r:
        note = f"peer prints {r['peer_model_tflops']} TFLOP/s, {r.get('peer_params_M')} M params"
    out.append(f"| {r['run']} | {f(r.get('median_ms', 'n/a'))} | {f(r.get('mean_ms'))} | {r.get('tokens', '')} | "
               f"{f(r.get('model_tflops'), 1)} | {r.get('peak_mib', '')} | {note} |")
def ratio(a, b, k="median_ms"):
    x, y = val(a, k), val(b, k)
    return x / y if x and y else None
def meets(r, op, target): return r <= target if op == "<=" else r >= target
def line(text, r, op, target):
    if r is None:
        return f"- {text}: n/a (target {op} {target})"
    return f"- {text}: {r:.3f} (target {op} {target}: {'met' if meets(r, op, target) else 'missed'})"
def pairs_line(text, a, b, op, target):
    """The ratio a/b over the pair (a, b) and its repeats (a-r1, b-r1, ...)."""
    pairs = [(a, b)]
    k = 1
    while f"{a}-r{k}" in by or f"{b}-r{k}" in by:
        pairs.append((f"{a}-r{k}", f"{b}-r{k}"))
        k += 1
    rs = [r for r in (ratio(x, y) for x, y in pairs) if r is not None]
    if len(rs) < 2:
        return line(text, rs[0] if rs else None, op, target)
    lo, hi = min(rs), max(rs)
    worst, best = (hi, lo) if op == "<=" else (lo, hi)
    verdict = "met" if meets(worst, op, target) else ("missed" if not meets(best, op, target) else "unsettled")
    return (f"- {text}: {statistics.median(rs):.3f}, from {lo:.3f} to {hi:.3f} over {len(rs)} pairs "
            f"(target {op} {target}: {verdict})")
def stats_line(text, with_stats, without):
    """The statistics cost over the pair (with_stats, without) and its repeats."""
    return pairs_line(text, with_stats, without, "<=", 1.03)
def speedup_line(text, bf16, delayed):
    """The FP8 speed-up over the pair (bf16, delayed) and its repeats."""
    return pairs_line(text, bf16, delayed, ">=", 1.3)
def has(*names): return any(n in by for n in names)
def ref_line(text, r):
    """A reference ratio with no target of its own."""
    return f"- {text}: {'n/a' if r is None else f'{r:.3f}'} (reference)"
def dump_line(text, dump, nodump, every):
    """The dump cost at one dump every `every` steps, from a run that dumped more often: the ms a
    dump (the mean step's excess over the run without dumps, times the steps timed, over the dumps
    among them) over `every` steps of the run without, judged against the 5% target."""
    r10 = ratio(dump, nodump, "mean_ms")
    n, k, base = val(dump, "window_steps"), val(dump, "window_dumps"), val(nodump, "mean_ms")
    if r10 is None or not n or not k or not base:
        return line(f"{text} (measured more often: dump/nodump mean ms, an upper bound)", r10, "<=", 1.05)
    per_dump = (val(dump, "mean_ms") - base) * n / k
    projected = 1.0 + per_dump / every / base
    return (f"- {text}, from {k} dumps in {n} timed steps ({per_dump:.0f} ms a dump; dump/nodump mean ms as measured "
            f"{r10:.3f}): {projected:.3f} (target <= 1.05: {'met' if projected <= 1.05 else 'missed'})")
out.append("")
if has("seed-bf16", "torch_compile_fused_b4", "seed-delayed", "seed-delayed-nostats"):
    out.append(line("seed b4, bf16 vs torch.compile: ours/theirs ms", ratio("seed-bf16", "torch_compile_fused_b4"), "<=", 0.5))
    out.append(line("seed b4, FP8 delayed speed-up over our bf16 (bf16/delayed ms)", ratio("seed-bf16", "seed-delayed"), ">=", 1.05))
    out.append(stats_line("seed b4, statistics every step vs none (delayed/delayed-nostats ms)", "seed-delayed", "seed-delayed-nostats"))
if has("seed-delayed-dump", "seed-delayed-nodump"):
    out.append(line("seed b4, dump of one layer every 50 steps, mean ms over 200 steps (dump/nodump)",
                    ratio("seed-delayed-dump", "seed-delayed-nodump", "mean_ms"), "<=", 1.05))
if has("torch_compile_fused_b32", "seed-bf16-b32", "seed-delayed-b32", "seed-delayed-nostats-b32"):
    out.append(line("seed b32, bf16 vs torch.compile: ours/theirs ms", ratio("seed-bf16-b32", "torch_compile_fused_b32"), "<=", 1.0))
    out.append(speedup_line("seed b32, FP8 delayed speed-up over our bf16 (bf16/delayed ms)", "seed-bf16-b32", "seed-delayed-b32"))
    out.append(stats_line("seed b32, statistics every step vs none (delayed/delayed-nostats ms)", "seed-delayed-b32", "seed-delayed-nostats-b32"))
if has("seed-bf16-nostats-b32"):
    out.append(line("seed b32, bf16 without statistics (what the peer records) vs torch.compile: ours/theirs ms",
                    ratio("seed-bf16-nostats-b32", "torch_compile_fused_b32"), "<=", 1.0))
    out.append(line("seed b32, FP8 delayed speed-up over our bf16, both without statistics", ratio("seed-bf16-nostats-b32", "seed-delayed-nostats-b32"), ">=", 1.3))
    out.append(line("seed b32, peak memory ours (delayed) / torch", ratio("seed-delayed-b32", "torch_compile_fused_b32", "peak_mib"), "<=", 1.2))
    out.append(line("seed b32, peak memory ours (bf16) / torch", ratio("seed-bf16-b32", "torch_compile_fused_b32", "peak_mib"), "<=", 1.2))
if has("torch_fp8_full_b32"):
    out.append(ref_line("seed b32, PyTorch's FP8 speed-up: torch.compile bf16 / torch.compile with every encoder GEMM in FP8 "
                        "(bench/torch_fp8_peer.py, current scaling) ms", ratio("torch_compile_fused_b32", "torch_fp8_full_b32")))
    out.append(ref_line("seed b32, our FP8 delayed step against PyTorch's FP8 step: theirs/ours ms", ratio("torch_fp8_full_b32", "seed-delayed-b32")))
P = "torch_llama_1b_compile_fused"
if has(P, "llama-1b-bf16", "llama-1b-delayed", "llama-1b-delayed-nostats", "llama-1b-delayed-dump10", "llama-1b-delayed-nodump"):
    out.append(line("llama-1b, bf16 vs torch.compile (HF Llama): ours/theirs ms", ratio("llama-1b-bf16", P), "<=", 0.9))
    out.append(speedup_line("llama-1b, FP8 delayed speed-up over our bf16 (bf16/delayed ms)", "llama-1b-bf16", "llama-1b-delayed"))
    out.append(stats_line("llama-1b, statistics every step vs none (delayed/delayed-nostats ms)", "llama-1b-delayed", "llama-1b-delayed-nostats"))
if has("llama-1b-bf16-nostats"):
    out.append(line("llama-1b, bf16 without statistics (what the peer records) vs torch.compile: ours/theirs ms",
                    ratio("llama-1b-bf16-nostats", P), "<=", 0.9))
    out.append(line("llama-1b, FP8 delayed speed-up over our bf16, both without statistics", ratio("llama-1b-bf16-nostats", "llama-1b-delayed-nostats"), ">=", 1.3))
    out.append(line("llama-1b, peak memory ours (delayed) / torch", ratio("llama-1b-delayed", P, "peak_mib"), "<=", 1.2))
    out.append(line("llama-1b, peak memory ours (bf16) / torch", ratio("llama-1b-bf16", P, "peak_mib"), "<=", 1.2))
if has("llama-1b-delayed-dump10", "llama-1b-delayed-nodump"):
    out.append(dump_line("llama-1b, dump of layers.5.fc1 every 50 steps", "llama-1b-delayed-dump10", "llama-1b-delayed-nodump", 50))
if has("llama-1b-delayed-fastacc"):
    out.append(line("llama-1b, FP8 delayed with fast accumulation in every GEMM (--accumulation fast) over our bf16",
                    ratio("llama-1b-bf16", "llama-1b-delayed-fastacc"), ">=", 1.3))
out.append("")
out.append("Model TFLOP/s: 6 x (parameters - V*C) x B*T + 12 x L x B x T^2 x C per step (torch_llama.py's convention: "
           "every weight matrix but the embedding, lm_head included; attention over the full T x T square, not halved for "
           "the causal mask) over the median step (the peers: their ms_step).")
text = "\n".join(out)
print(text)
open(sys.argv[2], "w").write(text + "\n")
