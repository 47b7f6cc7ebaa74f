set -u
O=$OUT
cd gpu-bundle
echo "== new cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/new_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/new_cuda_layers.txt | head -8
echo "== cast throughput, mid (d47281a) | new (default-grid µs)"
timeout 60 mid/cuda_layers --ignored --nocapture cast_throughput > $O/tp_mid.txt 2>&1; echo "rc $?"
timeout 60 bin/cuda_layers --ignored --nocapture cast_throughput > $O/tp_new.txt 2>&1; echo "rc $?"
paste -d' ' <(grep -E ' (both|T) ' $O/tp_mid.txt | awk '{print $1, $2, $3, $4, $13}') <(grep -E ' (both|T) ' $O/tp_new.txt | awk '{print $13}')
echo "== every table, old (c7fc0fa) vs new (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh old bin $O/dsc cuda > $O/dsc.txt 2>&1; echo "rc $?"; grep -E '^(small|llama-small):' $O/dsc.txt | cut -c1-600
rm -rf $O/dsc
echo "== speed llama-1b delayed, 10 steps, interleaved old / mid / new"
i=0
for b in old mid bin old mid bin; do
  i=$((i+1))
  timeout 70 $b/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out $O/runs/$b-$i > /dev/null 2>&1
  echo "-- $b ($i): $(python3 bench/runs.py speed $O/runs/$b-$i --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py same $O/runs/old-1 $O/runs/bin-3
rm -rf $O/runs
