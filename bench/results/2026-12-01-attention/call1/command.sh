set -u
B=gpu-bundle; O=$OUT
cd $B
echo "== speed llama-1b delayed 12 steps"
for v in old new alt; do
  bin=bin; [ $v = old ] && bin=old; [ $v = alt ] && bin=alt
  timeout 150 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 12 --out $O/runs/l1b-$v > $O/l1b-$v.log 2>&1
  echo "-- $v rc $?"; python3 bench/runs.py speed $O/runs/l1b-$v --skip 4
done
python3 bench/runs.py same $O/runs/l1b-old $O/runs/l1b-new
python3 bench/runs.py same $O/runs/l1b-old $O/runs/l1b-alt
echo "== cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.log 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|attention forward|fused" $O/test_cuda_layers.log | head -20
echo "== profile"
for v in new alt; do
  bin=bin; [ $v = alt ] && bin=alt
  FP8SCOPE_PROFILE=1 timeout 100 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p-$v > $O/prof-$v.log 2>&1
  echo "-- $v"; grep -E "attention|total" $O/prof-$v.log
done
echo "== ncu"
timeout 200 bash bench/ncu_kernels.sh bin $O/ncu llama-1b delayed
