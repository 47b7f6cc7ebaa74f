#!/usr/bin/env bash
# Two builds of fp8-capture side by side, in one call on the GPU machine: how a change to the CUDA
# engine is measured (the machine moves by several ms a llama-1b step between calls, so only
# builds run in the same call are compared). In order, each part named in PARTS:
#  tests       the new build's cuda_layers (every layer against the CPU, bit-exact casts, reruns);
#  throughput  the cast kernels alone, old | new, µs with the default grid (cast_throughput);
#  tables      every recorded table, old against new (dump_shadow_check.sh: bit for bit, or the
#              largest relative difference of each column that moved);
#  speed       llama-1b (or PRESET) delayed scaling with and without statistics, ROUNDS rounds of
#              old / new interleaved, STEPS steps each, median ms of steps 5 on; the loss columns
#              of the first old and new runs compared bit for bit;
#  profile     FP8SCOPE_PROFILE=1 for each build (GPU and host ms a step by primitive).
# Usage: bench/compare_builds.sh OLD_BIN_DIR NEW_BIN_DIR OUT_DIR
# Each BIN_DIR holds fp8-capture and, for tests and throughput, cuda_layers (bench/stage.sh).
# Environment: PARTS (default "tests throughput tables speed profile"), PRESET (llama-1b), STEPS
# (10), ROUNDS (2). About 8 minutes at the defaults on an H200; a part that fails says so and the
# script goes on (exit status 1 at the end).
set -uo pipefail
OLD=${1:?old bin dir}; NEW=${2:?new bin dir}; OUT=${3:?out dir}
PARTS=${PARTS:-tests throughput tables speed profile}
PRESET=${PRESET:-llama-1b}; STEPS=${STEPS:-10}; ROUNDS=${ROUNDS:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
status=0
has() { [[ " $PARTS " == *" $1 "* ]]; }
median() { python3 "$HERE/runs.py" speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }

if has tests; then
  echo "== tests: $NEW/cuda_layers"
  timeout 200 "$NEW/cuda_layers" --nocapture --test-threads 1 > "$OUT/cuda_layers.txt" 2>&1 || status=1
  grep -E "test result|FAILED|panicked" "$OUT/cuda_layers.txt" | head -8
fi
if has throughput; then
  echo "== cast throughput, default grid µs: shape format layout level old new"
  for v in old new; do
    b=$NEW; [ $v = old ] && b=$OLD
    timeout 90 "$b/cuda_layers" --ignored --nocapture cast_throughput > "$OUT/throughput_$v.txt" 2>&1 || status=1
  done
  paste -d' ' <(grep -E ' (both|T|N) ' "$OUT/throughput_old.txt" | awk '{print $1, $2, $3, $4, $13}') \
    <(grep -E ' (both|T|N) ' "$OUT/throughput_new.txt" | awk '{print $13}')
fi
if has tables; then
  echo "== every table, old against new (dump_shadow_check.sh)"
  timeout 200 bash "$HERE/dump_shadow_check.sh" "$OLD" "$NEW" "$OUT/tables" cuda > "$OUT/tables.txt" 2>&1 || status=1
  grep -E '^(small|llama-small):' "$OUT/tables.txt" | cut -c1-600
  rm -rf "$OUT/tables"
fi
if has speed; then
  echo "== $PRESET delayed, $STEPS steps, median ms, old / new interleaved ($ROUNDS rounds)"
  mkdir -p "$OUT/runs"
  for i in $(seq 1 "$ROUNDS"); do
    for stats in stats nostats; do
      extra=(); [ $stats = nostats ] && extra=(--stats-every 0)
      line="round $i, $stats:"
      for v in old new; do
        b=$NEW; [ $v = old ] && b=$OLD
        run="$OUT/runs/$v-$stats-$i"
        if timeout 120 "$b/fp8-capture" train --quiet --device cuda --preset "$PRESET" --recipe delayed "${extra[@]}" \
            --steps "$STEPS" --out "$run" > "$run.log" 2>&1; then
          line="$line $v $(median "$run")"
        else
          line="$line $v failed"; status=1
        fi
      done
      echo "$line"
    done
  done
  echo -n "loss columns, old against new: "
  python3 "$HERE/runs.py" same "$OUT/runs/old-stats-1" "$OUT/runs/new-stats-1" || status=1
  rm -rf "$OUT/runs"
fi
if has profile; then
  echo "== profiles, $PRESET delayed, 8 steps (GPU ms, host ms, calls a step)"
  for v in old new; do
    b=$NEW; [ $v = old ] && b=$OLD
    FP8SCOPE_PROFILE=1 timeout 120 "$b/fp8-capture" train --quiet --device cuda --preset "$PRESET" --recipe delayed \
      --steps 8 --out "$OUT/profile-$v" > "$OUT/profile_$v.txt" 2>&1 || status=1
    echo "-- $v"; grep -E "^  (gemm|attention|adamw|total)" "$OUT/profile_$v.txt" | head -8
    rm -rf "$OUT/profile-$v"
  done
fi
echo "== compare_builds status $status"
exit $status
