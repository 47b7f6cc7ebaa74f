#!/usr/bin/env bash
# The cost of statistics every step, with its spread: runs with statistics every step and without
# (`--stats-every 0`), alternated PAIRS times in one call, so that the machine's drift between runs
# shows in the figure instead of hiding in it. Prints each round's ratio (with / without, median
# step ms after SKIP steps), then one JSON line: the median, lowest and highest ratio. One reading
# of speed.sh's statistics row has moved by 2.6 points between calls with one binary (+3.3% to
# +5.9% at llama-1b); this gives the spread inside one call.
# Usage: bench/stats_cost.sh BIN_DIR OUT_DIR [PRESET (llama-1b)] [RECIPE (delayed)] [PAIRS (3)] [STEPS (12)]
#   llama-1b: about 35 s a run, so 3 pairs fit in 4 minutes. DEVICE (cuda) picks the backend
#   (DEVICE=cpu checks the script itself on a small preset). RUN_FLAGS adds flags to every run,
#   e.g. RUN_FLAGS="--batch 32" with PRESET seed for the seed b32 shape. STATS_FLAGS adds flags to
#   the runs with statistics, e.g. STATS_FLAGS="--channel-stats-every 10" for the cost without the
#   per-channel statistics on most steps.
#   VARIANTS compares several ways of taking the statistics in one call: flag sets separated by
#   ';' (e.g. VARIANTS="--channel-stats-every 1;--channel-stats-every 10"); each round then runs
#   one run a variant, in the order given, then the run without statistics, and every variant's
#   cost is taken against its own round's run without statistics. One JSON line a variant. VARIANTS
#   replaces STATS_FLAGS; a variant may be empty (statistics with the defaults).
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; PRESET=${3:-llama-1b}; RECIPE=${4:-delayed}; PAIRS=${5:-3}; STEPS=${6:-12}
HERE=$(cd "$(dirname "$0")" && pwd)
SKIP=$(( STEPS > 8 ? 4 : 1 ))
[[ $PAIRS =~ ^[1-9][0-9]*$ && $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "stats_cost.sh: PAIRS and STEPS are positive integers" >&2; exit 2; }
[ -x "$BIN/fp8-capture" ] || { echo "stats_cost.sh: no fp8-capture in $BIN" >&2; exit 2; }
if [ -n "${VARIANTS+set}" ]; then
  IFS=';' read -r -a variants <<< "$VARIANTS"
  [ "${#variants[@]}" -gt 0 ] || { echo "stats_cost.sh: VARIANTS is set but names no variant" >&2; exit 2; }
else
  variants=("${STATS_FLAGS:-}")
fi
mkdir -p "$OUT/runs"
median_ms() { python3 "$HERE/runs.py" speed "$1" --skip "$SKIP" | python3 -c 'import json,sys; print(json.load(sys.stdin)["median_ms"])'; }
read -r -a every_run <<< "${RUN_FLAGS:-}"
# One run into $OUT/runs/$1 with the flags after it; prints its median step ms.
run_ms() {
  local name=$1; shift
  local run="$OUT/runs/$name"
  if ! timeout 300 "$BIN/fp8-capture" train --quiet --device "${DEVICE:-cuda}" --preset "$PRESET" --recipe "$RECIPE" --steps "$STEPS" \
      "${every_run[@]}" "$@" --out "$run" > "$run.log" 2>&1; then
    echo "stats_cost.sh: the run $name failed: $(tail -1 "$run.log")" >&2; return 1
  fi
  median_ms "$run"
}
# ratios[v] holds variant v's ratios, space-separated, round by round.
ratios=()
for p in $(seq 1 "$PAIRS"); do
  with=()
  for v in "${!variants[@]}"; do
    read -r -a flags <<< "${variants[$v]}"
    # The first variant's runs keep the names of a call without VARIANTS (stats-P).
    name=$([ "$v" -eq 0 ] && echo "stats-$p" || echo "stats-v$v-$p")
    with+=("$(run_ms "$name" "${flags[@]}")") || exit 1
  done
  without=$(run_ms "nostats-$p" --stats-every 0) || exit 1
  for v in "${!variants[@]}"; do
    r=$(python3 -c "print(${with[$v]} / $without)")
    ratios[v]="${ratios[v]:-} $r"
    label=$([ "${#variants[@]}" -gt 1 ] && echo " [${variants[$v]:-defaults}]" || true)
    printf 'pair %d%s: %.2f ms with statistics, %.2f without: %+.1f%%\n' "$p" "$label" "${with[$v]}" "$without" "$(python3 -c "print(($r - 1) * 100)")"
  done
done
# The card (an H100's and an H200's costs differ): nvidia-smi's name, or "none" without one.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
for v in "${!variants[@]}"; do
  # shellcheck disable=SC2086 # the ratios are words
  python3 - "$PRESET" "$RECIPE" "${variants[$v]}" "${GPU_NAME:-none}" ${ratios[$v]} <<'PY'
import json, statistics, sys
preset, recipe, flags, gpu, rs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], [float(x) for x in sys.argv[5:]]
print(json.dumps({"check": "stats_cost", "gpu": gpu, "preset": preset, "recipe": recipe, "stats_flags": flags, "pairs": len(rs),
                  "median_ratio": statistics.median(rs), "lowest": min(rs), "highest": max(rs),
                  "target": 1.03, "met": statistics.median(rs) <= 1.03}))
PY
done
