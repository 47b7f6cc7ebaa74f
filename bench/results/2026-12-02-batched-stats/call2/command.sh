set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers on the candidate (computed sources at 4 blocks an SM, inputs at their tile at the cheap level)"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/cuda_layers.txt; grep -c "bit-identical" $O/cuda_layers.txt
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
mkdir -p $O/runs
echo "== llama-1b delayed with statistics, 10 steps, median ms: base (d2b9ca2) / v1 (SwiGLU backward at 4 blocks) / bin (every computed source at 4 blocks)"
for i in 1 2; do line="round $i:"; for v in base v1 bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out $O/runs/$v-$i > $O/runs/$v-$i.log 2>&1
  line="$line $v $(med $O/runs/$v-$i)"
done; echo "$line"; done
for v in v1 bin; do echo -n "loss base vs $v: "; python3 bench/runs.py same $O/runs/base-1 $O/runs/$v-1; done
echo "== seed b32 delayed with statistics, 12 steps"
for i in 1 2; do line="round $i:"; for v in base v1 bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $O/runs/b32-$v-$i > $O/runs/b32-$v-$i.log 2>&1
  line="$line $v $(med $O/runs/b32-$v-$i)"
done; echo "$line"; done
for v in v1 bin; do echo -n "b32 loss base vs $v: "; python3 bench/runs.py same $O/runs/b32-base-1 $O/runs/b32-$v-1; done
echo "== profiles of the candidate, 8 steps"
FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p > $O/profile_llama.txt 2>&1
grep -E "^  (gemm|total)" $O/profile_llama.txt
FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 8 --out $O/runs/pb > $O/profile_b32.txt 2>&1
grep -E "^  (gemm|total)" $O/profile_b32.txt
rm -rf $O/runs
