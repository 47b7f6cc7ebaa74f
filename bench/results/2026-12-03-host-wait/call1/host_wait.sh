#!/usr/bin/env bash
# How long the GPU waits for the host's launches in a step, on a machine with an NVIDIA GPU.
# Usage: bench/host_wait.sh BIN_DIR [LEAD_MS_SEED] [LEAD_MS_LLAMA]
#
# Each case runs twice as many steps as it skips, alternately plain and with FP8SCOPE_LEAD_US (the
# GPU held at the start of every step's forward, long enough for the host to queue the whole step
# first: capture/src/backend/cuda/probe.rs), two rounds. A held step's time less the hold is the
# step with no wait for the host; the plain step's time less that is the wait. Prints one line a
# run (median ms after the skipped steps) and one a case:
#   CASE  plain P ms  held H ms (less the hold: G ms)  the GPU waits P - G ms a step for the host
set -u
BIN=${1:?usage: bench/host_wait.sh BIN_DIR [LEAD_MS_SEED] [LEAD_MS_LLAMA]}
LEAD_SEED=${2:-60}
LEAD_LLAMA=${3:-150}
for v in "$LEAD_SEED" "$LEAD_LLAMA"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "host_wait.sh: a lead is a whole number of ms, not '$v'" >&2; exit 2; }
done
HERE=$(cd "$(dirname "$0")" && pwd)
W=${HOST_WAIT_DIR:-$(mktemp -d)}
med() { python3 "$HERE/runs.py" speed "$1" --skip "$2" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['median_ms'])"; }
one() {  # name lead_ms steps skip args...
  local name=$1 lead=$2 steps=$3 skip=$4; shift 4
  rm -rf "$W/$name"
  if ! FP8SCOPE_LEAD_US=$((lead * 1000)) timeout -k 10 "${HOST_WAIT_TIMEOUT:-120}" "$BIN/fp8-capture" train --quiet --device cuda \
      --steps "$steps" --out "$W/$name" "$@" > "$W/$name.log" 2>&1; then
    echo "$name: failed: $(tail -1 "$W/$name.log")" >&2; echo nan; return
  fi
  med "$W/$name" "$skip"
}
case_() {  # label lead_ms steps skip args...
  local label=$1 lead=$2 steps=$3 skip=$4; shift 4
  local p=() h=()
  for r in 1 2; do
    p+=("$(one "$label-plain-r$r" 0 "$steps" "$skip" "$@")")
    h+=("$(one "$label-held-r$r" "$lead" "$steps" "$skip" "$@")")
    echo "  $label round $r: plain ${p[-1]} ms, held ${h[-1]} ms (hold $lead ms)"
  done
  python3 - "$label" "$lead" "${p[@]}" -- "${h[@]}" <<'PY'
import math, statistics, sys
label, lead = sys.argv[1], float(sys.argv[2])
rest = sys.argv[3:]; cut = rest.index("--")
plain = [float(x) for x in rest[:cut]]; held = [float(x) for x in rest[cut + 1:]]
if any(math.isnan(x) for x in plain + held):
    print(f"{label}: a run failed, no figure"); sys.exit(0)
p, h = statistics.median(plain), statistics.median(held)
g = h - lead
print(f"{label}  plain {p:.2f} ms  held {h:.2f} ms (less the hold: {g:.2f} ms)  "
      f"the GPU waits {p - g:.2f} ms a step for the host ({(p - g) / p * 100:.1f}%)")
PY
}
case_ "seed-b32-bf16" "$LEAD_SEED" 16 6 --preset seed --batch 32 --recipe bf16
case_ "seed-b32-delayed" "$LEAD_SEED" 16 6 --preset seed --batch 32 --recipe delayed
case_ "llama-1b-bf16" "$LEAD_LLAMA" 12 4 --preset llama-1b --recipe bf16
case_ "llama-1b-delayed" "$LEAD_LLAMA" 12 4 --preset llama-1b --recipe delayed
