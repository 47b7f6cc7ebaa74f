set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.log 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked" $O/test_cuda_layers.log | head -10
echo "== every table, old vs new (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh old bin $O/dsc cuda 2>&1 | tail -4
echo "== speed llama-1b delayed 12 steps, old then new"
for v in old new; do
  bin=bin; [ $v = old ] && bin=old
  timeout 150 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 12 --out $O/runs/l1b-$v > $O/l1b-$v.log 2>&1
  echo "-- $v"; python3 bench/runs.py speed $O/runs/l1b-$v --skip 4
done
python3 bench/runs.py same $O/runs/l1b-old $O/runs/l1b-new
echo "== profile new"
timeout 300 bash bench/llama_profile.sh bin $O/prof llama-1b 2>&1 | grep -E "==|gemm|reports|total|median"
