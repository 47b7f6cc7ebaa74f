set -u
O=$OUT
cd gpu-bundle
echo "== new cuda_layers"
timeout 80 alt/cuda_layers --nocapture --test-threads 1 > $O/new_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/new_cuda_layers.txt | head -5
echo "== every table, b27e536 vs new (dump_shadow_check)"
timeout 100 bash bench/dump_shadow_check.sh bin alt $O/dsc cuda 2>&1 | tail -3
echo "== speed llama-1b delayed, 10 steps, interleaved"
for v in prev new prev new; do
  bin=bin; [ $v = new ] && bin=alt
  i=$((${i:-0}+1))
  timeout 60 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out $O/runs/$v-$i > /dev/null 2>&1
  echo "-- $v ($i): $(python3 bench/runs.py speed $O/runs/$v-$i --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py tables $O/runs/prev-1 $O/runs/new-2
