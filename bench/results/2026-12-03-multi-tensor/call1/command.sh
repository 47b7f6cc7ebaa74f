# Call 1: the multi-tensor optimizer launches (bin) against the previous engine (old, dcdfad0's):
# the layer tests, then llama-1b delayed interleaved, old new old new, every table compared.
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
echo "== cuda_layers"
timeout 260 bin/cuda_layers --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"; grep -E "test result|FAILED|panicked|buffers: sumsq" $O/cuda_layers.txt | head
echo "== llama-1b delayed, 10 steps, median ms (old new old new)"
run l-old1 old llama-1b 10 --recipe delayed; run l-new1 bin llama-1b 10 --recipe delayed
run l-old2 old llama-1b 10 --recipe delayed; run l-new2 bin llama-1b 10 --recipe delayed
echo; echo -n "tables old vs new: "; python3 bench/runs.py tables $R/l-old1 $R/l-new1 | tail -1
echo "== seed b32 delayed, 12 steps (old new old new)"
run b-old1 old seed 12 --recipe delayed --batch 32; run b-new1 bin seed 12 --recipe delayed --batch 32
run b-old2 old seed 12 --recipe delayed --batch 32; run b-new2 bin seed 12 --recipe delayed --batch 32
echo; echo -n "tables old vs new: "; python3 bench/runs.py tables $R/b-old1 $R/b-new1 | tail -1
