set -u
O=$OUT
cd gpu-bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $O/gpu.txt 2>&1
echo "== new cuda_kernels"
timeout 60 bin/cuda_kernels > $O/new_cuda_kernels.txt 2>&1; echo "rc $?"; grep -E "test result|FAILED|panicked" $O/new_cuda_kernels.txt | head -5
echo "== new cuda_layers"
timeout 100 bin/cuda_layers --nocapture --test-threads 1 > $O/new_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/new_cuda_layers.txt | head -5
echo "== cast throughput, old then new"
timeout 60 old/cuda_layers --ignored --nocapture cast_throughput > $O/old_cast_throughput.txt 2>&1; echo "rc $?"
timeout 60 bin/cuda_layers --ignored --nocapture cast_throughput > $O/new_cast_throughput.txt 2>&1; echo "rc $?"
paste -d'|' <(grep -iE 'GB/s|TB/s' $O/old_cast_throughput.txt) <(grep -iE 'GB/s|TB/s' $O/new_cast_throughput.txt) | head -30
echo "== every table, old vs new (dump_shadow_check)"
timeout 120 bash bench/dump_shadow_check.sh old bin $O/dsc cuda > $O/dsc.txt 2>&1; echo "rc $?"; tail -12 $O/dsc.txt
echo "== speed llama-1b, 10 steps, interleaved"
i=0
for spec in "old delayed" "new delayed" "new delayed-nostats" "old delayed" "new delayed" "new delayed-nostats" "old bf16" "new bf16"; do
  set -- $spec
  i=$((i+1)); bin=bin; [ $1 = old ] && bin=old
  r=${2%-nostats}; extra=""; [ "$2" != "$r" ] && extra="--stats-every 0"
  timeout 70 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r $extra --steps 10 --out $O/runs/$1-$2-$i > $O/run-$i.log 2>&1
  echo "-- $1 $2 ($i): $(python3 bench/runs.py speed $O/runs/$1-$2-$i --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py same $O/runs/old-delayed-1 $O/runs/new-delayed-2
python3 bench/runs.py tables $O/runs/old-delayed-1 $O/runs/new-delayed-2 | tail -8
rm -rf $O/runs $O/dsc
