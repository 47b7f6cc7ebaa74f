# Call 6: the lm_head's logits and dlogits in BF16 (bin) against dcdfad0's engine (old): the layer
# tests, then old/new runs with every table compared, llama-1b delayed and seed b32 delayed and bf16.
set -u
O=$OUT
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$O/gemm-algorithms.json
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bindir preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 150 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $n $(med $R/$n)"
}
peak() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > $R/mem.log 2>/dev/null & P=$!; }
peakend() { kill $P 2>/dev/null; wait $P 2>/dev/null; echo -n " (peak $(sort -n $R/mem.log | tail -1) MiB)"; }
echo "== cuda_layers"
timeout 200 bin/cuda_layers --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"; grep -E "test result|FAILED|panicked" $O/cuda_layers.txt | head
echo "== llama-1b delayed, 10 steps (old new)"
run l-old old llama-1b 10 --recipe delayed; run l-new bin llama-1b 10 --recipe delayed
echo; echo -n "tables: "; python3 bench/runs.py tables $R/l-old $R/l-new | tail -1
echo "== seed b32 delayed, 12 steps (old new old new), then bf16 (old new)"
run b-old1 old seed 12 --recipe delayed --batch 32; run b-new1 bin seed 12 --recipe delayed --batch 32
run b-old2 old seed 12 --recipe delayed --batch 32; run b-new2 bin seed 12 --recipe delayed --batch 32
echo; echo -n "tables delayed: "; python3 bench/runs.py tables $R/b-old1 $R/b-new1 | tail -1
peak; run h-old old seed 12 --recipe bf16 --batch 32; peakend; peak; run h-new bin seed 12 --recipe bf16 --batch 32; peakend
echo; echo -n "tables bf16: "; python3 bench/runs.py tables $R/h-old $R/h-new | tail -1
