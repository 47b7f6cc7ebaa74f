#!/usr/bin/env bash
# The power cap, on a machine with an NVIDIA GPU: the SM clock, the power drawn and the energy of a
# step while a preset trains, ours (BF16 and FP8 delayed) beside the peer, and ours again with the
# GPU held at each step's start (FP8SCOPE_LEAD_US, capture/src/backend/cuda/probe.rs), which lets
# it cool between steps. PRESET llama-1b (default): torch_llama.py under torch.compile; seed-b32:
# the seed preset at batch 32 beside torch_tiny.py compile_fused.
# Usage: bench/power.sh BIN_DIR OUT_DIR [LEAD_MS] [llama-1b|seed-b32]
#
# A GPU at its power limit lowers its clock: a step's time then follows the energy it takes, and a
# held step (the hold less) runs faster than a plain one because the GPU starts it rested, not
# because the plain step waited for the host (FP8SCOPE_PROFILE=1 prints that wait, the GPU's idle
# time between spans). Writes OUT_DIR/power.jsonl (bench/power_summary.py's rows, each with the
# run's median step) and prints them.
set -u
USAGE="usage: bench/power.sh BIN_DIR OUT_DIR [LEAD_MS] [llama-1b|seed-b32]"
BIN=${1:?$USAGE}
OUT=${2:?$USAGE}
LEAD=${3:-150}
PRESET=${4:-llama-1b}
[[ "$LEAD" =~ ^[0-9]+$ ]] || { echo "power.sh: LEAD_MS is a whole number of ms, not '$LEAD'" >&2; exit 2; }
case "$PRESET" in
  llama-1b) OURS=(--preset llama-1b); PEER=(torch_llama.py --preset llama-1b --variant compile_fused --warmup 5 --steps 16) ;;
  seed-b32) OURS=(--preset seed --batch 32); PEER=(torch_tiny.py --variant compile_fused --batch 32 --warmup 10 --steps 30) ;;
  *) echo "power.sh: unknown preset '$PRESET' (llama-1b, seed-b32)" >&2; exit 2 ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
TO=${POWER_TIMEOUT:-150}
mkdir -p "$OUT/runs"
RES="$OUT/power.jsonl"; : > "$RES"
smi_start() { nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$OUT/$1.smi.csv" 2>/dev/null & SMI=$!; }
smi_stop() { kill $SMI 2>/dev/null; wait $SMI 2>/dev/null; }
summary() {  # name step_ms [--held]
  python3 "$HERE/power_summary.py" "$OUT/$1.smi.csv" --name "$1" --step-ms "$2" ${3:-} | tee -a "$RES"
}
ours() {  # name lead_ms args...
  local name=$1 lead=$2; shift 2
  rm -rf "$OUT/runs/$name"
  smi_start "$name"
  FP8SCOPE_LEAD_US=$((lead * 1000)) timeout -k 10 "$TO" "$BIN/fp8-capture" train --quiet --device cuda "${OURS[@]}" \
    --steps 16 --out "$OUT/runs/$name" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  smi_stop
  [ $rc -eq 0 ] || { echo "$name: rc $rc: $(tail -1 "$OUT/$name.log")"; return; }
  local ms
  ms=$(python3 "$HERE/runs.py" speed "$OUT/runs/$name" --skip 4 | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['median_ms'])")
  [ -n "$ms" ] || { echo "$name: no median step (runs.py speed $OUT/runs/$name)"; return; }
  # A held step's time less the hold: the step at the clock of a rested GPU.
  summary "$name" "$(python3 -c "print($ms - $lead)")" "$([ "$lead" -gt 0 ] && echo --held)"
}
peer() {
  smi_start peer
  timeout -k 10 "$TO" python3 "$HERE/${PEER[0]}" "${PEER[@]:1}" > "$OUT/peer.log" 2>&1
  local rc=$?
  smi_stop
  local ms
  ms=$(python3 "$HERE/runs.py" peer "$OUT/peer.log" peer | python3 -c "import json,sys; print(json.loads(sys.stdin.read()).get('median_ms', ''))")
  [ $rc -eq 0 ] && [ -n "$ms" ] || { echo "peer: rc $rc: $(tail -1 "$OUT/peer.log")"; return; }
  summary peer "$ms"
}
peer
ours "$PRESET-bf16" 0 --recipe bf16
ours "$PRESET-delayed" 0 --recipe delayed
ours "$PRESET-bf16-held" "$LEAD" --recipe bf16
ours "$PRESET-delayed-held" "$LEAD" --recipe delayed
