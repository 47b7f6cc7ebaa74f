# Call 2 (the final binary of this pass against prev, 1d92fe4's engine): the new bias-gradient
# test alone, bench/gpu_check.sh, seed b32 tables against prev, seed b32 profiles, then
# bench/speed.sh b32 (torch.compile side by side). Files beyond output.txt go into results.tgz.
set -u
cd gpu-bundle
W=/tmp/w; mkdir -p $W; R=/tmp/runs; mkdir -p $R
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
sp() { python3 bench/runs.py speed "$@" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['run'], d['median_ms'], d.get('final_loss'))"; }
date +%T
bin/cuda_layers bias_gradients --nocapture 2>&1 | tail -14
echo "== gpu_check"; date +%T
timeout 250 bash bench/gpu_check.sh bin $W/gc > $W/gpu_check.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|parity|determinism|status" $W/gpu_check.txt | cut -c1-300
for r in bf16 delayed; do
  for b in prev bin; do
    timeout 60 $b/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 20 --recipe $r --out $R/s-$b-$r > /dev/null 2>&1; sp $R/s-$b-$r --skip 5
  done
  python3 bench/runs.py tables $R/s-prev-$r $R/s-bin-$r 2>&1 | tail -1
  FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 7 --recipe $r --out $R/p-seed-$r > $W/profile_seed_$r.txt 2>&1
  echo "== profile seed $r rc $?"; grep -E "bias_grad|total" $W/profile_seed_$r.txt
done
date +%T
(while sleep 15; do cp $W/speed/benchmarks_rows.md $W/speed/speed.jsonl $OUT/ 2>/dev/null; done) & CP=$!
timeout 280 bash bench/speed.sh bin $W/speed b32 > $W/b32.txt 2>&1; echo "speed rc $?"
grep -E "target|ours/theirs|ratio|stats" $W/b32.txt | head -30
date +%T
cd $W && tar czf $OUT/results.tgz --exclude='runs' --exclude='gc/runs' . 
kill $CP
