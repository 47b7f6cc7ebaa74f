set -u
O=$OUT
cd gpu-bundle
echo "== speed llama-1b delayed 12 steps"
for v in old new alt; do
  bin=bin; [ $v = old ] && bin=old; [ $v = alt ] && bin=alt
  timeout 150 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 12 --out $O/runs/l1b-$v > $O/l1b-$v.log 2>&1
  echo "-- $v rc $?"; python3 bench/runs.py speed $O/runs/l1b-$v --skip 4
done
python3 bench/runs.py same $O/runs/l1b-old $O/runs/l1b-new
python3 bench/runs.py same $O/runs/l1b-old $O/runs/l1b-alt
echo "== profile"
for v in new alt; do
  bin=bin; [ $v = alt ] && bin=alt
  FP8SCOPE_PROFILE=1 timeout 100 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p-$v > $O/prof-$v.log 2>&1
  echo "-- $v"; grep -E "attention|rope|total" $O/prof-$v.log
done
echo "== cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.log 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|outside|attention forward" $O/test_cuda_layers.log | head -20
echo "== old vs new, 100 steps"
for p in small llama-small; do for r in bf16 delayed; do
  old/fp8-capture train --quiet --device cuda --preset $p --recipe $r --steps 100 --out $O/runs/$p-$r-old > /dev/null 2>&1 &
  bin/fp8-capture train --quiet --device cuda --preset $p --recipe $r --steps 100 --out $O/runs/$p-$r-new > /dev/null 2>&1
  wait
  echo "-- $p $r"; python3 bench/runs.py same $O/runs/$p-$r-old $O/runs/$p-$r-new
done; done
echo "== ncu"
timeout 150 bash bench/ncu_kernels.sh bin $O/ncu llama-1b delayed '^(flash_.*_d64|attention_split_.*)$'
