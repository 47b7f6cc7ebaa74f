#!/usr/bin/env bash
# Speed of fp8-capture on the GPU against the PyTorch peers (torch_tiny.py for seed, torch_llama.py for
# llama-1b), side by side in one call, so that only same-run ratios are compared (the machine varies
# ±20% between calls). Prints one table and writes it as Markdown rows to OUT_DIR/benchmarks_rows.md
# (rewritten after every row, so a call cut short still leaves the rows it measured).
# Usage: bench/speed.sh BIN_DIR OUT_DIR [quick|nolong|b32|llama]
#   (none): seed b4, the dump cost, seed b32, then the four 1000-step training runs
#   quick:  the seed b4 runs only;  nolong: everything but the 1000-step training runs
#   b32:    the seed batch-32 rows only (torch_tiny.py compile_fused, torch_fp8_peer.py, ours bf16 /
#           delayed / delayed without statistics / bf16 without statistics);  llama: the llama-1b rows only
#           (torch_llama.py compile_fused, ours bf16 / delayed / delayed without statistics / bf16
#           without statistics / delayed with fast accumulation everywhere / the dump cost). Each
#           fits in 10 minutes.
# The statistics cost (delayed with statistics against without) and the FP8 speed-up (our bf16
# against delayed) are measured STATS_ROUNDS more times (default 2), interleaved, and judged over
# every pair (speed_summary.py). SPEED_TIMEOUT (seconds, default 300) bounds each process; one
# that fails or runs past it leaves an error row and the script goes on.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; MODE=${3:-}
case "$MODE" in ""|quick|nolong|b32|llama) ;; *) echo "unknown mode '$MODE' (quick, nolong, b32, llama)" >&2; exit 2;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
TO=${SPEED_TIMEOUT:-300}
ROUNDS=${STATS_ROUNDS:-2}
[[ "$ROUNDS" =~ ^[0-9]+$ ]] || { echo "STATS_ROUNDS must be a whole number, not '$ROUNDS'" >&2; exit 2; }
mkdir -p "$OUT/runs"
RES="$OUT/speed.jsonl"; : > "$RES"
# The card the rows were measured on (speed_summary.py heads the table with it): an H100's and an
# H200's ratios differ (the statistics' cost, bench/BENCHMARKS.md), so a table says which it is.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 > "$OUT/gpu.txt"
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
  case "$script" in torch_tiny.py | torch_fp8_peer.py) dims=("${SEED_DIMS[@]}" --batch "$PEER_BATCH") ;; esac
  peak_start
  timeout -k 15 "$TO" python3 "$HERE/$script" "$@" > "$log" 2>&1
  local rc=$? mem; mem=$(peak_stop)
  [ $rc -eq 124 ] && echo "timed out after ${TO}s" >> "$log"
  python3 "$HERE/runs.py" peer "$log" "$name" --peak-mib "${mem:-0}" ${dims[@]+"${dims[@]}"} | tee -a "$RES"
  summary > /dev/null
}
torch_peer() { PEER_BATCH=$2 peer "torch_$1_b$2" torch_tiny.py --variant "$1" --batch "$2" --warmup 10 --steps 30; }
summary() { python3 "$HERE/speed_summary.py" "$RES" "$OUT/benchmarks_rows.md"; }
# The statistics cost and the FP8 speed-up move by a few percent from one run to the next: ROUNDS
# more rounds of our bf16 run, the delayed run with statistics and the delayed run without,
# interleaved (NAME-rK); speed_summary.py judges each ratio over every pair, and says "unsettled"
# when the pairs straddle the target.
rounds() {  # bf16_name with_name without_name preset steps skip args...
  local bf16=$1 with=$2 without=$3 preset=$4 steps=$5 skip=$6; shift 6
  for i in $(seq 1 "$ROUNDS"); do
    cap "$bf16-r$i" "$preset" "$steps" "$skip" "$@" --recipe bf16
    cap "$with-r$i" "$preset" "$steps" "$skip" "$@" --recipe delayed
    cap "$without-r$i" "$preset" "$steps" "$skip" "$@" --recipe delayed --stats-every 0
  done
}
seed_b32() {
  torch_peer compile_fused 32
  # PyTorch's own FP8 step (every encoder GEMM in FP8, current scaling), for its speed-up beside ours.
  PEER_BATCH=32 peer torch_fp8_full_b32 torch_fp8_peer.py --batch 32 --warmup 10 --steps 30
  cap seed-bf16-b32 seed 30 10 --recipe bf16 --batch 32
  cap seed-delayed-b32 seed 30 10 --recipe delayed --batch 32
  cap seed-delayed-nostats-b32 seed 30 10 --recipe delayed --batch 32 --stats-every 0
  cap seed-bf16-nostats-b32 seed 30 10 --recipe bf16 --batch 32 --stats-every 0
  rounds seed-bf16-b32 seed-delayed-b32 seed-delayed-nostats-b32 seed 30 10 --batch 32
}
llama_1b() {
  peer torch_llama_1b_compile_fused torch_llama.py --preset llama-1b --variant compile_fused --warmup 5 --steps 10
  cap llama-1b-bf16 llama-1b 12 4 --recipe bf16
  cap llama-1b-delayed llama-1b 12 4 --recipe delayed
  cap llama-1b-delayed-nostats llama-1b 12 4 --recipe delayed --stats-every 0
  cap llama-1b-bf16-nostats llama-1b 12 4 --recipe bf16 --stats-every 0
  # The default accumulates fprop fast and dgrad / wgrad split (Transformer Engine's choice); this
  # row accumulates every FP8 GEMM fast.
  cap llama-1b-delayed-fastacc llama-1b 12 4 --recipe delayed --accumulation fast
  rounds llama-1b-bf16 llama-1b-delayed llama-1b-delayed-nostats llama-1b 12 4
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
    rounds seed-bf16 seed-delayed seed-delayed-nostats seed $S 10
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
