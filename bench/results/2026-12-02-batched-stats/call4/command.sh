set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers on the batched statistics reduction"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt; grep -c "bit-identical" $O/cuda_layers.txt
echo "== every table, d2b9ca2 against the new build (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh base bin $O/tables > $O/tables.txt 2>&1; echo "rc $?"; grep -vE "^\s*$" $O/tables.txt | tail -4
rm -rf $O/tables
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
mkdir -p $O/runs
echo "== llama-1b delayed, 10 steps, median ms: base (d2b9ca2) / bin"
for i in 1 2; do line="round $i stats:"; for v in base bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out $O/runs/$v-$i > $O/runs/$v-$i.log 2>&1
  line="$line $v $(med $O/runs/$v-$i)"
done; echo "$line"; done
echo -n "loss base vs bin: "; python3 bench/runs.py same $O/runs/base-1 $O/runs/bin-1
echo "== seed b32 delayed, 12 steps"
for i in 1 2; do line="round $i stats:"; for v in base bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $O/runs/b32-$v-$i > $O/runs/b32-$v-$i.log 2>&1
  line="$line $v $(med $O/runs/b32-$v-$i)"
done; echo "$line"; done
line="llama round 1 nostats:"; for v in base bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --stats-every 0 --steps 10 --out $O/runs/n-$v > $O/runs/n-$v.log 2>&1
  line="$line $v $(med $O/runs/n-$v)"
done; echo "$line"
FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 6 --out $O/runs/p > $O/profile_llama.txt 2>&1
grep -E "^  (gemm|total)" $O/profile_llama.txt
rm -rf $O/runs
