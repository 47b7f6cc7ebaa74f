#!/usr/bin/env bash
# The PyTorch recorder end to end on a GPU machine with torch: checks the torch casts and device
# statistics against the numpy reference, records bench/torch_tiny.py's model for 300 steps in BF16,
# in FP8 and in FP8 with a planted mis-scaled activation cast, runs fp8-analyze on the pairs
# (compare, anomalies, locate, report), and measures the recorder's overhead.
#
# Usage: bench/torch_recorder.sh FP8_ANALYZE OUT [WORK]
#   FP8_ANALYZE  path of the fp8-analyze binary
#   OUT          folder for the results: at most 8 small files (logs, report.tar.gz)
#   WORK         folder for the runs and the report (default: OUT/work; large)
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 FP8_ANALYZE OUT [WORK]" >&2; exit 2; }
ANALYZE=$1 OUT=$2 WORK=${3:-$2/work}
[ -x "$ANALYZE" ] || { echo "$0: $ANALYZE is not an executable fp8-analyze" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK/bf16" "$WORK/fp8" "$WORK/fp8-fault" "$WORK/report"
export PYTHONUNBUFFERED=1
fail=0

echo "== torch casts and device statistics against numpy"
python3 "$HERE/torch_cast_check.py" >"$OUT/cast_check.log" 2>&1 || fail=1
tail -1 "$OUT/cast_check.log"

echo "== recording 300 steps: bf16, fp8, fp8-fault"
for v in bf16 fp8 fp8-fault; do
  python3 "$HERE/torch_recorder.py" train --variant "$v" --out "$WORK/$v" || fail=1
done 2>&1 | tee "$OUT/train.log" | grep -E "RESULT|Error|error" || true

echo "== fp8-analyze on the pairs"
{
  for run in fp8 fp8-fault; do
    echo "---- summary $run"; "$ANALYZE" summary "$WORK/$run"
    echo "---- anomalies $run --baseline bf16"; "$ANALYZE" anomalies "$WORK/$run" --baseline "$WORK/bf16"
    echo "---- compare $run --baseline bf16 (cosine < 0.99 flagged)"; "$ANALYZE" compare "$WORK/$run" --baseline "$WORK/bf16" --only-flagged
    echo "---- locate $run --baseline bf16"; "$ANALYZE" locate "$WORK/$run" --baseline "$WORK/bf16"
    echo "---- locate $run (shadow GEMMs)"; "$ANALYZE" locate "$WORK/$run"
  done
  echo "---- report fp8-fault --baseline bf16"
  "$ANALYZE" report "$WORK/fp8-fault" --baseline "$WORK/bf16" --out "$WORK/report"
} >"$OUT/analyze.log" 2>&1 || fail=1
grep -A12 -- "---- locate fp8-fault (shadow" "$OUT/analyze.log" | head -16
tar -czf "$OUT/report.tar.gz" -C "$WORK" report 2>/dev/null || true

echo "== overhead: recorder at stats_every=1 against none, eager and compiled"
python3 "$HERE/torch_recorder.py" overhead >"$OUT/overhead.log" 2>&1 || fail=1
grep -v RESULT "$OUT/overhead.log" | tail -6
exit $fail
