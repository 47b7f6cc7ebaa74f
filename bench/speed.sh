#!/usr/bin/env bash
# Speed of fp8-capture on the GPU against the PyTorch peers (torch_tiny.py for seed, torch_llama.py for
# llama-1b), side by side in one call, so that only same-run ratios are compared (the machine varies
# ±20% between calls). Prints one table and writes it as Markdown rows to OUT_DIR/benchmarks_rows.md
# (rewritten after every row, so a call cut short still leaves the rows it measured).
# Usage: bench/speed.sh BIN_DIR OUT_DIR [quick|nolong|b32|llama]
#   (none): seed b4, the dump cost, seed b32, then the four 1000-step training runs
#   quick:  the seed b4 runs only;  nolong: everything but the 1000-step training runs
#   b32:    the seed batch-32 rows only (torch_tiny.py compile_fused, ours bf16 / delayed / delayed
#           without statistics / bf16 without statistics);  llama: the llama-1b rows only
#           (torch_llama.py compile_fused, ours bf16 / delayed / delayed without statistics / bf16
#           without statistics / the dump cost). Each fits in 10 minutes.
# SPEED_TIMEOUT (seconds, default 300) bounds each process; one that fails or runs past it leaves an
# error row and the script goes on.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; MODE=${3:-}
case "$MODE" in ""|quick|nolong|b32|llama) ;; *) echo "unknown mode '$MODE' (quick, nolong, b32, llama)" >&2; exit 2;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
TO=${SPEED_TIMEOUT:-300}
mkdir -p "$OUT/runs"
RES="$OUT/speed.jsonl"; : > "$RES"
# The seed preset's dims (capture/src/config.rs), for torch_tiny.py's TFLOP/s; our runs read theirs
# from run.json, torch_llama.py prints its own.
SEED_DIMS=(--arch gpt --vocab 32000 --channels 1024 --ffn 4096 --heads 16 --layers 12 --seq 512)
peak_start() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/mem.log" 2>/dev/null & MEMPID=$!; }
peak_stop() { kill $MEMPID 2>/dev/null; wait $MEMPID 2>/dev/null; sort -n "$OUT/mem.log" | tail -1 | tr -dc 0-9; }
err_row() {  # name message
  python3 -c 'import json,sys; print(json.dumps({"run": sys.argv[1], "error": sys.argv[2][:300]}))' "$1" "$2" | tee -a "$RES"
  summary > /dev/null
}
cap() {  # name preset steps skip args...
  local name=$1 preset=$2 steps=$3 skip=$4; shift 4
  local log="$OUT/runs/$name.log" row
  peak_start
  timeout -k 15 "$TO" "$BIN/fp8-capture" train --quiet --device cuda --preset "$preset" --steps "$steps" --out "$OUT/runs/$name" "$@" > "$log" 2>&1
  local rc=$? mem; mem=$(peak_stop)
  if [ $rc -ne 0 ]; then err_row "$name" "rc $rc$([ $rc -eq 124 ] && echo " (past ${TO}s)"): $(tail -1 "$log")"; return; fi
  if row=$(python3 "$HERE/runs.py" speed "$OUT/runs/$name" --skip "$skip" --name "$name" --peak-mib "${mem:-0}" 2>&1); then
    echo "$row" | tee -a "$RES"; summary > /dev/null
  else
    err_row "$name" "runs.py speed: $row"
  fi
}
peer() {  # name script args... (a peer that prints a RESULT line; runs.py peer turns it into a row)
  local name=$1 script=$2; shift 2
  local log="$OUT/$name.log" dims=()
  [ "$script" = torch_tiny.py ] && dims=("${SEED_DIMS[@]}" --batch "$PEER_BATCH")
  peak_start
  timeout -k 15 "$TO" python3 "$HERE/$script" "$@" > "$log" 2>&1
  local rc=$? mem; mem=$(peak_stop)
  [ $rc -eq 124 ] && echo "timed out after ${TO}s" >> "$log"
  python3 "$HERE/runs.py" peer "$log" "$name" --peak-mib "${mem:-0}" ${dims[@]+"${dims[@]}"} | tee -a "$RES"
  summary > /dev/null
}
torch_peer() { PEER_BATCH=$2 peer "torch_$1_b$2" torch_tiny.py --variant "$1" --batch "$2" --warmup 10 --steps 30; }
summary() {
python3 - "$RES" "$OUT/benchmarks_rows.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["run"]: r for r in rows}
def val(n, k): return by.get(n, {}).get(k)
def f(x, nd=2): return "" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))
out = ["| run | ms/step (median) | ms/step (mean) | tokens/step | model TFLOP/s | peak GPU MiB | note |",
       "| --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    note = r.get("error", "")
    if "peer_model_tflops" in r:
        note = f"peer prints {r['peer_model_tflops']} TFLOP/s, {r.get('peer_params_M')} M params"
    out.append(f"| {r['run']} | {f(r.get('median_ms', 'n/a'))} | {f(r.get('mean_ms'))} | {r.get('tokens', '')} | "
               f"{f(r.get('model_tflops'), 1)} | {r.get('peak_mib', '')} | {note} |")
def ratio(a, b, k="median_ms"):
    x, y = val(a, k), val(b, k)
    return x / y if x and y else None
def line(text, r, op, target):
    if r is None:
        return f"- {text}: n/a (target {op} {target})"
    ok = r <= target if op == "<=" else r >= target
    return f"- {text}: {r:.3f} (target {op} {target}: {'met' if ok else 'missed'})"
def has(*names): return any(n in by for n in names)
out.append("")
if has("seed-bf16", "torch_compile_fused_b4", "seed-delayed", "seed-delayed-nostats"):
    out.append(line("seed b4, bf16 vs torch.compile: ours/theirs ms", ratio("seed-bf16", "torch_compile_fused_b4"), "<=", 0.5))
    out.append(line("seed b4, FP8 delayed speed-up over our bf16 (bf16/delayed ms)", ratio("seed-bf16", "seed-delayed"), ">=", 1.05))
    out.append(line("seed b4, statistics every step vs none (delayed/delayed-nostats ms)", ratio("seed-delayed", "seed-delayed-nostats"), "<=", 1.03))
if has("seed-delayed-dump", "seed-delayed-nodump"):
    out.append(line("seed b4, dump of one layer every 50 steps, mean ms over 200 steps (dump/nodump)",
                    ratio("seed-delayed-dump", "seed-delayed-nodump", "mean_ms"), "<=", 1.05))
if has("torch_compile_fused_b32", "seed-bf16-b32", "seed-delayed-b32", "seed-delayed-nostats-b32"):
    out.append(line("seed b32, bf16 vs torch.compile: ours/theirs ms", ratio("seed-bf16-b32", "torch_compile_fused_b32"), "<=", 1.0))
    out.append(line("seed b32, FP8 delayed speed-up over our bf16 (bf16/delayed ms)", ratio("seed-bf16-b32", "seed-delayed-b32"), ">=", 1.3))
    out.append(line("seed b32, statistics every step vs none (delayed/delayed-nostats ms)", ratio("seed-delayed-b32", "seed-delayed-nostats-b32"), "<=", 1.03))
if has("seed-bf16-nostats-b32"):
    out.append(line("seed b32, bf16 without statistics (what the peer records) vs torch.compile: ours/theirs ms",
                    ratio("seed-bf16-nostats-b32", "torch_compile_fused_b32"), "<=", 1.0))
    out.append(line("seed b32, FP8 delayed speed-up over our bf16, both without statistics", ratio("seed-bf16-nostats-b32", "seed-delayed-nostats-b32"), ">=", 1.3))
    out.append(line("seed b32, peak memory ours (delayed) / torch", ratio("seed-delayed-b32", "torch_compile_fused_b32", "peak_mib"), "<=", 1.2))
    out.append(line("seed b32, peak memory ours (bf16) / torch", ratio("seed-bf16-b32", "torch_compile_fused_b32", "peak_mib"), "<=", 1.2))
P = "torch_llama_1b_compile_fused"
if has(P, "llama-1b-bf16", "llama-1b-delayed", "llama-1b-delayed-nostats", "llama-1b-delayed-dump10", "llama-1b-delayed-nodump"):
    out.append(line("llama-1b, bf16 vs torch.compile (HF Llama): ours/theirs ms", ratio("llama-1b-bf16", P), "<=", 0.9))
    out.append(line("llama-1b, FP8 delayed speed-up over our bf16 (bf16/delayed ms)", ratio("llama-1b-bf16", "llama-1b-delayed"), ">=", 1.3))
    out.append(line("llama-1b, statistics every step vs none (delayed/delayed-nostats ms)", ratio("llama-1b-delayed", "llama-1b-delayed-nostats"), "<=", 1.03))
if has("llama-1b-bf16-nostats"):
    out.append(line("llama-1b, bf16 without statistics (what the peer records) vs torch.compile: ours/theirs ms",
                    ratio("llama-1b-bf16-nostats", P), "<=", 0.9))
    out.append(line("llama-1b, FP8 delayed speed-up over our bf16, both without statistics", ratio("llama-1b-bf16-nostats", "llama-1b-delayed-nostats"), ">=", 1.3))
    out.append(line("llama-1b, dump of layers.5.fc1 every 10 steps vs none, mean ms over steps 5-30 (dump/nodump; "
                    "5x denser than every 50, so an upper bound for it)",
                    ratio("llama-1b-delayed-dump10", "llama-1b-delayed-nodump", "mean_ms"), "<=", 1.05))
    out.append(line("llama-1b, peak memory ours (delayed) / torch", ratio("llama-1b-delayed", P, "peak_mib"), "<=", 1.2))
    out.append(line("llama-1b, peak memory ours (bf16) / torch", ratio("llama-1b-bf16", P, "peak_mib"), "<=", 1.2))
out.append("")
out.append("Model TFLOP/s: 6 x (parameters - V*C) x B*T + 12 x L x B x T^2 x C per step (torch_llama.py's convention: "
           "every weight matrix but the embedding, lm_head included; attention over the full T x T square, not halved for "
           "the causal mask) over the median step (the peers: their ms_step).")
text = "\n".join(out)
print(text)
open(sys.argv[2], "w").write(text + "\n")
PY
}
seed_b32() {
  torch_peer compile_fused 32
  cap seed-bf16-b32 seed 30 10 --recipe bf16 --batch 32
  cap seed-delayed-b32 seed 30 10 --recipe delayed --batch 32
  cap seed-delayed-nostats-b32 seed 30 10 --recipe delayed --batch 32 --stats-every 0
  cap seed-bf16-nostats-b32 seed 30 10 --recipe bf16 --batch 32 --stats-every 0
}
llama_1b() {
  peer torch_llama_1b_compile_fused torch_llama.py --preset llama-1b --variant compile_fused --warmup 5 --steps 10
  cap llama-1b-bf16 llama-1b 12 4 --recipe bf16
  cap llama-1b-delayed llama-1b 12 4 --recipe delayed
  cap llama-1b-delayed-nostats llama-1b 12 4 --recipe delayed --stats-every 0
  cap llama-1b-bf16-nostats llama-1b 12 4 --recipe bf16 --stats-every 0
  # The dump cost: every 10 steps over 30 (dumps at 1, 10, 20, 30) against the same 30 steps without.
  cap llama-1b-delayed-dump10 llama-1b 30 4 --recipe delayed --dump-every 10 --dump-layers 'layers\.5\.fc1'
  cap llama-1b-delayed-nodump llama-1b 30 4 --recipe delayed
}
export PYTHONUNBUFFERED=1
case "$MODE" in
  b32) seed_b32 ;;
  llama) llama_1b ;;
  *)
    S=60; [ "$MODE" = quick ] && S=25
    torch_peer compile_fused 4
    cap seed-bf16 seed $S 10 --recipe bf16
    cap seed-delayed seed $S 10 --recipe delayed
    cap seed-delayed-nostats seed $S 10 --recipe delayed --stats-every 0
    if [ "$MODE" != quick ]; then
      cap seed-delayed-dump seed 200 0 --recipe delayed --dump-every 50 --dump-layers 'layers\.5\.fc1'
      cap seed-delayed-nodump seed 200 0 --recipe delayed
      seed_b32
      if [ "$MODE" != nolong ]; then
        cap seed-bf16-1000 seed 1000 10 --recipe bf16
        cap seed-delayed-1000 seed 1000 10 --recipe delayed
        # Where the FP8 gap comes from: the same run with a short amax history, and current scaling.
        cap seed-delayed-h16-1000 seed 1000 10 --recipe delayed --amax-history 16
        cap seed-current-1000 seed 1000 10 --recipe current
        for r in seed-bf16-1000 seed-delayed-1000 seed-delayed-h16-1000 seed-current-1000; do python3 "$HERE/runs.py" final "$OUT/runs/$r" | tee -a "$OUT/final.jsonl"; done
      fi
    fi
    ;;
esac
summary
