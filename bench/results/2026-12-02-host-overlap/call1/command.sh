set -u
O=$OUT
cd gpu-bundle
K='^(cast_src5_l[01]_f2|cast_fwd_l[01]_f1_t2|rmsnorm_bwd)$'
S="--section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats --section Occupancy --section LaunchStats"
for mode in stats nostats; do
  extra=""; [ $mode = nostats ] && extra="--stats-every 0"
  echo "== ncu $mode"
  timeout 280 ncu --clock-control none -k "regex:$K" --filter-mode per-launch-config --launch-skip 40 --launch-count 1 $S \
    -o /tmp/rep_$mode bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 4 $extra --out /tmp/run_$mode > $O/ncu_run_$mode.txt 2>&1
  echo "rc $?"; tail -3 $O/ncu_run_$mode.txt
  ncu -i /tmp/rep_$mode.ncu-rep --page details > $O/details_$mode.txt 2>&1
  ncu -i /tmp/rep_$mode.ncu-rep --page source --csv --print-source sass > /tmp/source_$mode.csv 2>&1; echo "source rc $? $(wc -c < /tmp/source_$mode.csv)"
  gzip -c /tmp/source_$mode.csv > $O/source_$mode.csv.gz
  grep -E "^  [a-z_0-9]+ \(|Duration|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Memory Throughput  " $O/details_$mode.txt | head -60
done
