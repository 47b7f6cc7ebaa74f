# Call 3: where the per-channel statistics' cost goes in the casts that pay most for them
# (llama-1b delayed): Nsight Compute's source counters of one launch of each kernel at step 3,
# channels every step against none on that step (--channel-stats-every 1000).
set -u
O=$OUT
cd gpu-bundle
K='^(cast_src5_l1_f2|cast_src1_l1_f1|cast_src6_l1_f1)$'
S="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats --section Occupancy --section LaunchStats"
for mode in ch1 ch1000; do
  extra="--channel-stats-every ${mode#ch}"
  echo "== ncu $mode"
  timeout 250 ncu --clock-control none -k "regex:$K" --filter-mode per-launch-config --launch-skip 40 --launch-count 1 $S \
    -o /tmp/rep_$mode bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 4 $extra --out /tmp/run_$mode > $O/ncu_run_$mode.txt 2>&1
  echo "rc $?"; tail -3 $O/ncu_run_$mode.txt
  ncu -i /tmp/rep_$mode.ncu-rep --page details > $O/details_$mode.txt 2>&1
  ncu -i /tmp/rep_$mode.ncu-rep --page source --csv --print-source sass > /tmp/source_$mode.csv 2>&1; echo "source rc $? $(wc -c < /tmp/source_$mode.csv)"
  gzip -c /tmp/source_$mode.csv > $O/source_$mode.csv.gz
  grep -E "^  [a-z_0-9]+ \(|Duration|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Memory Throughput  " $O/details_$mode.txt | head -60
done
