set -u
O=$OUT
cd gpu-bundle
echo "== computed test (9e893da)"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 activation_operands > $O/computed_test.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|bit-identical|rounding" $O/computed_test.txt | head -30
echo "== ncu, computed casts and the plain dual cast, statistics (l1) and none (l0)"
for spec in "l1 delayed" "l0 delayed --stats-every 0"; do
  set -- $spec; k=$1; r=$2; shift 2
  timeout 200 ncu --clock-control none -k "regex:^(cast_src[15]_${k}_f[12]|cast_fwd_${k}_f1_t2)\$" --filter-mode per-launch-config --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section InstructionStats --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    -o $O/ncu-$k bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r "$@" --steps 2 --out $O/runs/ncu-$k > $O/ncu-$k.log 2>&1
  echo "ncu $k rc $?"
  ncu -i $O/ncu-$k.ncu-rep --page details > $O/details-$k.txt 2>&1
  grep -E "^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occ|Theoretical Occ|Issue Slots Busy|Executed Ipc A|Memory Throughput|DRAM Throughput|Compute \(SM\) Th|No Eligible|Block Limit" $O/details-$k.txt | head -80
done
rm -rf $O/runs
