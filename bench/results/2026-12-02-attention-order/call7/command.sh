# Call 7: the kept dK/dV (three buffers, the division kept) against dcdfad0's kernels, kernel by kernel at four shapes;
# then the layer tests and the old binary (0b7d8a3, gpu-bundle/old) against the new one (gpu-bundle/bin), losses compared bit for bit.
set -u
for shape in 4,2048,32,8,64 32,512,16,16,64 4,2048,16,4,128 8,128,8,8,32; do
  python3 bench/flash_bench.py $OUT/s_${shape//,/_}.json $(cat gpu-bundle/fv7/all.txt) --shape $shape --rounds 3
done
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
timeout 200 bin/cuda_layers --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"; grep -E "test result|FAILED|panicked" $O/cuda_layers.txt | head
echo "== llama-1b, 10 steps, median ms (old new old new)"
run l-delayed-old1 old llama-1b 10 --recipe delayed; run l-delayed-new1 bin llama-1b 10 --recipe delayed
run l-delayed-old2 old llama-1b 10 --recipe delayed; run l-delayed-new2 bin llama-1b 10 --recipe delayed
echo; echo -n "losses delayed old vs new: "; python3 bench/runs.py same $R/l-delayed-old1 $R/l-delayed-new1 | tail -1
run l-bf16-old1 old llama-1b 10 --recipe bf16; run l-bf16-new1 bin llama-1b 10 --recipe bf16
echo; echo -n "losses bf16 old vs new: "; python3 bench/runs.py same $R/l-bf16-old1 $R/l-bf16-new1 | tail -1
echo "== seed b32, 12 steps"
run b-delayed-old1 old seed 12 --recipe delayed --batch 32; run b-delayed-new1 bin seed 12 --recipe delayed --batch 32
echo; echo -n "losses delayed old vs new: "; python3 bench/runs.py same $R/b-delayed-old1 $R/b-delayed-new1 | tail -1
