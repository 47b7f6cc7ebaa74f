set -u
O=$OUT
cd gpu-bundle
echo "== computed test (no prefetch)"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 activation_operands > $O/computed_test.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|bit-identical|rounding" $O/computed_test.txt | head -30
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
echo "== llama-1b delayed, 10 steps, median ms: base (9e893da) / bin (no prefetch) / v2 (no prefetch, +1 block for non-pair kinds)"
mkdir -p $O/runs
for i in 1 2; do for stats in stats nostats; do
  extra=(); [ $stats = nostats ] && extra=(--stats-every 0)
  line="round $i $stats:"
  for v in base bin v2; do
    timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed "${extra[@]}" --steps 10 --out $O/runs/$v-$stats-$i > $O/runs/$v-$stats-$i.log 2>&1
    line="$line $v $(med $O/runs/$v-$stats-$i)"
  done; echo "$line"
done; done
for v in bin v2; do echo -n "loss base vs $v: "; python3 bench/runs.py same $O/runs/base-stats-1 $O/runs/$v-stats-1; done
echo "== seed b32 delayed, 12 steps"
for v in base bin v2; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $O/runs/b32-$v > $O/runs/b32-$v.log 2>&1
  echo "$v $(med $O/runs/b32-$v)"
done
echo "== profiles, llama-1b delayed 8 steps: casts"
for v in base bin v2; do
  FP8SCOPE_PROFILE=1 timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p-$v > $O/profile_$v.txt 2>&1
  echo "-- $v"; grep -E "^  (gemm|attention|total)" $O/profile_$v.txt | head -9
done
echo "== ncu bin, pairs and swiglu casts"
for spec in "l1 delayed" "l0 delayed --stats-every 0"; do
  set -- $spec; k=$1; r=$2; shift 2
  timeout 150 ncu --clock-control none -k "regex:^(cast_src[15]_${k}_f[12])\$" --filter-mode per-launch-config --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section InstructionStats --section ComputeWorkloadAnalysis \
    -o $O/ncu-$k bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r "$@" --steps 2 --out $O/runs/ncu-$k > $O/ncu-$k.log 2>&1
  echo "ncu $k rc $?"
  ncu -i $O/ncu-$k.ncu-rep --page details > $O/details-$k.txt 2>&1
  grep -E "^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occ|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  " $O/details-$k.txt | head -40
done
rm -rf $O/runs $O/*.ncu-rep
