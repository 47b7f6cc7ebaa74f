# Call 5: the review's commit (bbaa34b: one helper for a tiled cast's per-column targets; a kernel
# comment) on the GPU: the tests, and its tables against prev (45e8561) at seed b32 BF16 and on
# small / llama-small with every layer dumped and shadow GEMMs.
set -u
cd gpu-bundle
W=/tmp/w5; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked" $W/cuda_layers.txt | head
for v in prev bin; do timeout 60 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 12 --recipe bf16 --out $W/r/$v > /dev/null 2>&1 || echo "$v failed"; done
echo -n "tables seed b32 bf16, prev vs bin: "; python3 bench/runs.py tables $W/r/prev $W/r/bin | cut -c1-300
timeout 80 bash bench/dump_shadow_check.sh prev bin $W/tables cuda > $W/tables.txt 2>&1; echo "dump_shadow_check rc $?"
grep -E '^(small|llama-small):' $W/tables.txt | cut -c1-300
date +%T
cp $W/cuda_layers.txt $W/tables.txt $OUT/
