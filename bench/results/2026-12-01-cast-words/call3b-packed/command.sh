set -u
O=$OUT
cd gpu-bundle
echo "== new cuda_layers"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 > $O/new_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|^test " $O/new_cuda_layers.txt | head -20
grep -E "scale .* overflow_nan" $O/new_cuda_layers.txt | head -4
echo "== cast throughput, old | new (default-grid µs)"
timeout 60 old/cuda_layers --ignored --nocapture cast_throughput > $O/tp_old.txt 2>&1; echo "rc $?"
timeout 60 bin/cuda_layers --ignored --nocapture cast_throughput > $O/tp_new.txt 2>&1; echo "rc $?"
paste -d' ' <(grep -E ' (both|T|N) ' $O/tp_old.txt | awk '{print $1, $2, $3, $4, $13}') <(grep -E ' (both|T|N) ' $O/tp_new.txt | awk '{print $13}')
echo "== every table, old vs new (dump_shadow_check)"
timeout 120 bash bench/dump_shadow_check.sh old bin $O/dsc cuda > $O/dsc.txt 2>&1; echo "rc $?"; grep -E '^(small|llama-small):' $O/dsc.txt | cut -c1-400
echo "== speed llama-1b, 10 steps, interleaved"
i=0
for spec in "old delayed" "bin delayed" "old delayed-nostats" "bin delayed-nostats" "old delayed" "bin delayed" "old delayed-nostats" "bin delayed-nostats"; do
  set -- $spec
  i=$((i+1))
  r=${2%-nostats}; extra=""; [ "$2" != "$r" ] && extra="--stats-every 0"
  timeout 70 $1/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r $extra --steps 10 --out $O/runs/$1-$2-$i > /dev/null 2>&1
  echo "-- $1 $2 ($i): $(python3 bench/runs.py speed $O/runs/$1-$2-$i --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py same $O/runs/old-delayed-1 $O/runs/bin-delayed-2
echo "== speed seed b32, 12 steps"
for spec in "old delayed" "bin delayed" "old delayed" "bin delayed"; do
  set -- $spec
  i=$((i+1))
  timeout 70 $1/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe $2 --steps 12 --out $O/runs/$1-seed-$i > /dev/null 2>&1
  echo "-- $1 seed b32 $2 ($i): $(python3 bench/runs.py speed $O/runs/$1-seed-$i --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
rm -rf $O/runs $O/dsc
