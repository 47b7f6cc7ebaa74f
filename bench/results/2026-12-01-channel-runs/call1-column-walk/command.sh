set -u
O=$OUT
cd gpu-bundle
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== new cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/new_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|^test " $O/new_cuda_layers.txt | head -20
echo "== cast throughput, old | new (default-grid µs)"
timeout 60 old/cuda_layers --ignored --nocapture cast_throughput > $O/tp_old.txt 2>&1; echo "rc $?"
timeout 60 bin/cuda_layers --ignored --nocapture cast_throughput > $O/tp_new.txt 2>&1; echo "rc $?"
paste -d' ' <(grep -E ' (both|T|N) ' $O/tp_old.txt | awk '{print $1, $2, $3, $4, $13}') <(grep -E ' (both|T|N) ' $O/tp_new.txt | awk '{print $13}')
echo "== every table, old vs new (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh old bin $O/dsc cuda > $O/dsc.txt 2>&1; echo "rc $?"; grep -E '^(small|llama-small):' $O/dsc.txt | cut -c1-600
rm -rf $O/dsc
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
python3 bench/runs.py same $O/runs/old-delayed-nostats-3 $O/runs/bin-delayed-nostats-4
echo "== profiles, llama-1b delayed, 8 steps"
for b in old bin; do
  FP8SCOPE_PROFILE=1 timeout 70 $b/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/prof-$b > $O/prof-$b.txt 2>&1
  echo "-- $b"; grep -E "gemm|total|reports|channel" $O/prof-$b.txt | head -12
done
rm -rf $O/runs
