set -u
O=$OUT
cd gpu-bundle
for v in bin v2; do
  echo "== computed test $v"
  timeout 120 $v/cuda_layers --nocapture --test-threads 1 activation_operands > $O/computed_test_$v.txt 2>&1; echo "rc $?"
  grep -E "test result|FAILED|panicked|bit-identical|rounding" $O/computed_test_$v.txt | grep -vc "bit-identical" ; grep -c "bit-identical" $O/computed_test_$v.txt
done
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
echo "== llama-1b delayed, 10 steps, median ms: base (9e893da) / bin (hybrid: 3-input kinds load at their tile) / v2 (every computed kind at its tile, +1 block for non-pair kinds)"
mkdir -p $O/runs
for i in 1 2; do for stats in stats nostats; do
  extra=(); [ $stats = nostats ] && extra=(--stats-every 0)
  line="round $i $stats:"
  for v in base bin v2; do
    timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed "${extra[@]}" --steps 10 --out $O/runs/$v-$stats-$i > $O/runs/$v-$stats-$i.log 2>&1
    line="$line $v $(med $O/runs/$v-$stats-$i)"
  done; echo "$line"
done; done
for v in bin v2; do echo -n "loss base vs $v: "; python3 bench/runs.py same $O/runs/base-stats-1 $O/runs/$v-stats-1; done
echo "== seed b32 delayed, 12 steps, 2 rounds"
for i in 1 2; do line="round $i:"; for v in base bin v2; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $O/runs/b32-$v-$i > $O/runs/b32-$v-$i.log 2>&1
  line="$line $v $(med $O/runs/b32-$v-$i)"
done; echo "$line"; done
for v in bin v2; do echo -n "b32 loss base vs $v: "; python3 bench/runs.py same $O/runs/b32-base-1 $O/runs/b32-$v-1; done
echo "== profiles, llama-1b delayed 8 steps, and seed b32"
for v in base bin v2; do
  FP8SCOPE_PROFILE=1 timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p-$v > $O/profile_$v.txt 2>&1
  echo "-- $v"; grep -E "^  (gemm|attention|total)" $O/profile_$v.txt | head -9
  FP8SCOPE_PROFILE=1 timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 8 --out $O/runs/pb-$v > $O/profile_b32_$v.txt 2>&1
  echo "-- b32 $v"; grep -E "^  (gemm|total)" $O/profile_b32_$v.txt | head -8
done
rm -rf $O/runs
