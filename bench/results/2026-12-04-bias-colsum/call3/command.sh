# Call 3: llama-1b (no biases: no column sums; the plain BF16 casts' kernels recompiled with the
# new parameter) BF16 with statistics, prev against bin interleaved, and its tables bit for bit.
set -u
cd gpu-bundle
W=/tmp/w3; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=/tmp/w/gemm-algorithms.json
date +%T
med() { python3 bench/runs.py speed $W/r/$1 --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2; do
  line="llama-1b bf16 round $i:"
  for v in prev bin; do
    timeout 120 $v/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe bf16 --out $W/r/$v-$i > $W/r/$v-$i.log 2>&1 || echo "$v-$i failed: $(tail -1 $W/r/$v-$i.log)"
    line="$line $v $(med $v-$i)"
  done
  echo "$line"
done
echo -n "tables llama-1b bf16, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-1 $W/r/bin-1 | cut -c1-600
date +%T
