#!/usr/bin/env bash
# The cost of statistics every step, with its spread: runs with statistics every step and without
# (`--stats-every 0`), alternated PAIRS times in one call, so that the machine's drift between runs
# shows in the figure instead of hiding in it. Prints each pair's ratio (with / without, median
# step ms after SKIP steps), then one JSON line: the median, lowest and highest ratio. One reading
# of speed.sh's statistics row has moved by 2.6 points between calls with one binary (+3.3% to
# +5.9% at llama-1b); this gives the spread inside one call.
# Usage: bench/stats_cost.sh BIN_DIR OUT_DIR [PRESET (llama-1b)] [RECIPE (delayed)] [PAIRS (3)] [STEPS (12)]
#   llama-1b: about 35 s a run, so 3 pairs fit in 4 minutes. DEVICE (cuda) picks the backend
#   (DEVICE=cpu checks the script itself on a small preset). STATS_FLAGS adds flags to the runs
#   with statistics, e.g. STATS_FLAGS="--channel-stats-every 10" for the cost without the
#   per-channel statistics on most steps; RUN_FLAGS adds flags to every run, e.g.
#   RUN_FLAGS="--batch 32" with PRESET seed for the seed b32 shape.
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; PRESET=${3:-llama-1b}; RECIPE=${4:-delayed}; PAIRS=${5:-3}; STEPS=${6:-12}
HERE=$(cd "$(dirname "$0")" && pwd)
SKIP=$(( STEPS > 8 ? 4 : 1 ))
[[ $PAIRS =~ ^[1-9][0-9]*$ && $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "stats_cost.sh: PAIRS and STEPS are positive integers" >&2; exit 2; }
mkdir -p "$OUT/runs"
median_ms() { python3 "$HERE/runs.py" speed "$1" --skip "$SKIP" | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])'; }
ratios=()
for p in $(seq 1 "$PAIRS"); do
  ms=()
  for mode in stats nostats; do
    run="$OUT/runs/$mode-$p"
    read -r -a extra <<< "${STATS_FLAGS:-}"; [ $mode = nostats ] && extra=(--stats-every 0)
    read -r -a every_run <<< "${RUN_FLAGS:-}"
    if ! timeout 300 "$BIN/fp8-capture" train --quiet --device "${DEVICE:-cuda}" --preset "$PRESET" --recipe "$RECIPE" --steps "$STEPS" \
        "${every_run[@]}" "${extra[@]}" --out "$run" > "$run.log" 2>&1; then
      echo "stats_cost.sh: the $mode run of pair $p failed: $(tail -1 "$run.log")" >&2; exit 1
    fi
    ms+=("$(median_ms "$run")")
  done
  r=$(python3 -c "print(${ms[0]} / ${ms[1]})")
  ratios+=("$r")
  printf 'pair %d: %.2f ms with statistics, %.2f without: %+.1f%%\n' "$p" "${ms[0]}" "${ms[1]}" "$(python3 -c "print(($r - 1) * 100)")"
done
python3 - "$PRESET" "$RECIPE" "${STATS_FLAGS:-}" "${ratios[@]}" <<'PY'
import json, statistics, sys
preset, recipe, flags, rs = sys.argv[1], sys.argv[2], sys.argv[3], [float(x) for x in sys.argv[4:]]
print(json.dumps({"check": "stats_cost", "preset": preset, "recipe": recipe, "stats_flags": flags, "pairs": len(rs),
                  "median_ratio": statistics.median(rs), "lowest": min(rs), "highest": max(rs),
                  "target": 1.03, "met": statistics.median(rs) <= 1.03}))
PY
