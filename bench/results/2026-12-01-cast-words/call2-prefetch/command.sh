# bin: PREFETCH_AHEAD 1; alt2, alt3: the same source built with PREFETCH_AHEAD 2 and 3 (variant.diff)
set -u
O=$OUT
cd gpu-bundle
echo "== new cuda_layers"
timeout 100 bin/cuda_layers --nocapture --test-threads 1 > $O/new_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/new_cuda_layers.txt | head -5
echo "== cast throughput (prefetch 1, 2, 3 tiles ahead)"
for v in bin alt2 alt3; do
  timeout 60 $v/cuda_layers --ignored --nocapture cast_throughput > $O/tp_$v.txt 2>&1; echo "rc $?"
done
echo "shape fmt out level: default-grid µs for prefetch 1 | 2 | 3"
paste -d' ' <(grep -E ' (both|T) ' $O/tp_bin.txt | awk '{print $1, $2, $3, $4, $13}') <(grep -E ' (both|T) ' $O/tp_alt2.txt | awk '{print $13}') <(grep -E ' (both|T) ' $O/tp_alt3.txt | awk '{print $13}')
echo "== every table, old vs new (dump_shadow_check)"
timeout 120 bash bench/dump_shadow_check.sh old bin $O/dsc cuda > $O/dsc.txt 2>&1; echo "rc $?"; grep -E '^(small|llama-small):' $O/dsc.txt | cut -c1-300
echo "== speed llama-1b delayed, 10 steps, interleaved"
i=0
for spec in "old delayed" "bin delayed" "alt2 delayed" "alt3 delayed" "bin delayed-nostats" "old delayed" "bin delayed" "alt2 delayed" "alt3 delayed"; do
  set -- $spec
  i=$((i+1))
  r=${2%-nostats}; extra=""; [ "$2" != "$r" ] && extra="--stats-every 0"
  timeout 70 $1/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r $extra --steps 10 --out $O/runs/$1-$2-$i > /dev/null 2>&1
  echo "-- $1 $2 ($i): $(python3 bench/runs.py speed $O/runs/$1-$2-$i --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py same $O/runs/old-delayed-1 $O/runs/bin-delayed-2
rm -rf $O/runs $O/dsc
