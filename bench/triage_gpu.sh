#!/usr/bin/env bash
# Triage of a built-in scenario on the GPU: the whole method (`fp8-analyze triage --device cuda`)
# on the `tiny` preset, then the scenario's effect on a larger preset (scenario_scale.sh).
# Usage: bench/triage_gpu.sh BIN OUT SCENARIO [SCALE_PRESET [STEPS]]
#   BIN holds fp8-capture and fp8-analyze; OUT receives the runs, triage.log and verdict.json.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; SCEN=${3:?scenario}; PRESET=${4:-}; STEPS=${5:-300}
mkdir -p "$OUT"
export PATH="$BIN:$PATH"
t0=$(date +%s.%N)
fp8-analyze triage --preset tiny --scenario "$SCEN" --device cuda --jobs 4 --out "$OUT/triage-$SCEN" > "$OUT/triage.log" 2>&1
echo "triage exit $? in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s" >> "$OUT/triage.log"
cp "$OUT/triage-$SCEN/verdict.json" "$OUT/verdict.json" 2>/dev/null
if [ -n "$PRESET" ]; then
  "$(dirname "$0")/scenario_scale.sh" "$BIN" "$OUT" "$SCEN" "$STEPS" "$PRESET" > "$OUT/scale.log" 2>&1
fi
