# Call 6: the review's cleanup (host-side slot bookkeeping; byte-identical cubins): cuda_layers,
# and seed b32 BF16 tables of prev (b0a4cb6) against bin, bit for bit.
set -u
cd gpu-bundle
W=/tmp/w6; rm -rf $W; mkdir -p $W/r
date +%T
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|^n [0-9]+ bf16" $W/cuda_layers.txt | head -24
for v in prev bin; do timeout 100 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 12 --recipe bf16 --out $W/r/$v > $W/r/$v.log 2>&1 || echo "$v failed"; done
echo -n "tables seed b32 bf16, prev vs bin: "; python3 bench/runs.py tables $W/r/prev $W/r/bin | cut -c1-400
date +%T
cp $W/cuda_layers.txt $OUT/
