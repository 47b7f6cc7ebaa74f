# Call 1 (the final engine of the twentieth pass, 629ec75, against prev = 1d92fe4's engine): the
# bias-gradient test alone, bench/gpu_check.sh, then seed b32 and llama-1b tables against prev.
# Files beyond output.txt go into results.tgz.
set -u
cd gpu-bundle
W=/tmp/w; mkdir -p $W; R=/tmp/runs; mkdir -p $R
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
sp() { python3 bench/runs.py speed "$@" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['run'], d['median_ms'], d.get('final_loss'))"; }
date +%T
bin/cuda_layers bias_gradients --nocapture 2>&1 | grep -v "^$" | tail -14
echo "== gpu_check"; date +%T
timeout 320 bash bench/gpu_check.sh bin $W/gc > $W/gpu_check.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|parity|same|status" $W/gpu_check.txt | cut -c1-300
date +%T
for r in bf16 delayed; do
  for b in prev bin; do
    timeout 60 $b/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 20 --recipe $r --out $R/s-$b-$r > /dev/null 2>&1; sp $R/s-$b-$r --skip 5
  done
  python3 bench/runs.py tables $R/s-prev-$r $R/s-bin-$r 2>&1 | tail -1
done
for b in prev bin; do
  timeout 80 $b/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe delayed --out $R/l-$b > /dev/null 2>&1; sp $R/l-$b --skip 4
done
python3 bench/runs.py tables $R/l-prev $R/l-bin 2>&1 | tail -1
date +%T
cd $W && tar czf $OUT/results.tgz --exclude='runs' --exclude='gc/runs' .
