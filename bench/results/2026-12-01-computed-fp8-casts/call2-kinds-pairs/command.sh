set -u
cd gpu-bundle
echo "== computed test"
timeout 120 bin/cuda_layers --nocapture --test-threads 1 activation_operands > $OUT/computed_test.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|bit-identical|rounding" $OUT/computed_test.txt | head -30
PARTS="speed profile" ROUNDS=2 bash bench/compare_builds.sh old bin $OUT/llama
for v in old new; do echo "-- profile $v"; grep -E "^  " $OUT/llama/profile_$v.txt | head -24; done
echo "== llama-1b bf16, old/new"
for v in old bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset llama-1b --recipe bf16 --steps 10 --out $OUT/bf-$v > $OUT/bf-$v.log 2>&1
  echo "$v $(python3 bench/runs.py speed $OUT/bf-$v --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done
python3 bench/runs.py same $OUT/bf-old $OUT/bf-bin
echo "== seed b32, delayed, old/new"
for r in 1 2; do for v in old bin; do
  timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --recipe delayed --steps 12 --out $OUT/b32-$v-$r > $OUT/b32-$v-$r.log 2>&1
  echo "round $r $v $(python3 bench/runs.py speed $OUT/b32-$v-$r --skip 4 | grep -oE '"median_ms": [0-9.]+')"
done; done
python3 bench/runs.py same $OUT/b32-old-1 $OUT/b32-bin-1
rm -rf $OUT/b32-*/ $OUT/bf-*/
