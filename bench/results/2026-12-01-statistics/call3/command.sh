set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.log 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|^test " $O/test_cuda_layers.log | head -20
echo "== every table, old vs new (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh old bin $O/dsc cuda 2>&1 | tail -4
echo "== profile new, delayed with and without statistics"
for spec in "delayed" "delayed --stats-every 0"; do
  set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"
  FP8SCOPE_PROFILE=1 timeout 120 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r "$@" --steps 8 --out $O/runs/p-$tag > $O/prof-$tag.log 2>&1
  echo "-- $tag"; grep -E "gemm|reports|total" $O/prof-$tag.log; python3 bench/runs.py speed $O/runs/p-$tag --skip 3
done
echo "== ncu source counters, dual casts l1 (stats) and l0 (no stats)"
for spec in "l1 delayed" "l0 delayed --stats-every 0"; do
  set -- $spec; k=$1; r=$2; shift 2
  timeout 150 ncu --clock-control none -k "regex:^cast_fwd_${k}_f1_t2\$" --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy --section InstructionStats \
    -o $O/ncu-$k bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r "$@" --steps 2 --out $O/runs/ncu-$k > $O/ncu-$k.log 2>&1
  echo "ncu $k rc $?"
  ncu -i $O/ncu-$k.ncu-rep --page source --csv --print-source sass > $O/sass-$k.csv 2>&1; echo "sass rc $?"; wc -l $O/sass-$k.csv
  ncu -i $O/ncu-$k.ncu-rep --page details > $O/details-$k.txt 2>&1
  grep -E "Duration|Grid Size|Registers|Achieved Occ|Issue Slots|Executed Instructions  " $O/details-$k.txt | head
done
