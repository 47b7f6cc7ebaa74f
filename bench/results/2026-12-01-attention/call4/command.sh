set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.log 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|outside|bit-identical|fused RoPE|RoPE, then" $O/test_cuda_layers.log | head -30
timeout 60 bin/cuda_layers --ignored cast_throughput --nocapture > $O/cast_throughput.log 2>&1; grep -E "16384x4096|shape" $O/cast_throughput.log | head -12
echo "== every table, old vs new (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh old bin $O/dsc cuda 2>&1 | tail -4
echo "== speed llama-1b 12 steps, old then new"
for r in delayed bf16; do for v in old new; do
  bin=bin; [ $v = old ] && bin=old
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $O/mem-$r-$v.log 2>/dev/null & mp=$!
  timeout 150 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r --steps 12 --out $O/runs/l1b-$r-$v > $O/l1b-$r-$v.log 2>&1
  kill $mp; wait $mp 2>/dev/null
  peak=$(sort -n $O/mem-$r-$v.log | tail -1 | tr -dc 0-9)
  echo "-- $r $v"; python3 bench/runs.py speed $O/runs/l1b-$r-$v --skip 4 --peak-mib "${peak:-0}"
done
python3 bench/runs.py same $O/runs/l1b-$r-old $O/runs/l1b-$r-new; done
echo "== profile new"
FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p-new > $O/prof-new.log 2>&1
sed -n '/== CUDA backend profile/,$p' $O/prof-new.log | head -24
echo "== ncu old, new"
for v in old new; do
  bin=bin; [ $v = old ] && bin=old
  timeout 100 bash bench/ncu_kernels.sh $bin $O/ncu-$v llama-1b delayed '^(cast_fwd_l1_f1_t2|flash_bwd_delta)$' 2 | grep -E "^  [a-z_0-9]+ \(|Duration|Executed Instructions  |Memory Throughput.*byte"
done
