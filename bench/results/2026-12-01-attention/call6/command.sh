set -u
O=$OUT
cd gpu-bundle
timeout 100 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.log 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|outside|dqkv bit-identical|^rope" $O/test_cuda_layers.log | head -20
for p in llama-small; do for r in delayed; do
  old/fp8-capture train --quiet --device cuda --preset $p --recipe $r --steps 100 --out $O/runs/$p-$r-old > /dev/null 2>&1 &
  bin/fp8-capture train --quiet --device cuda --preset $p --recipe $r --steps 100 --out $O/runs/$p-$r-new > /dev/null 2>&1
  wait; echo "-- $p $r"; python3 bench/runs.py same $O/runs/$p-$r-old $O/runs/$p-$r-new
done; done
