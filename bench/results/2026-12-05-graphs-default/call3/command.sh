# Call 3 (the same machine): one binary, the step launch by launch (FP8SCOPE_GRAPH=0) against in
# graphs (the default), delayed scaling: small and seed b32 30 steps, llama-1b 10 steps, median ms
# of the steps after the 4th; the loss columns of each pair compared.
cd gpu-bundle && export FP8SCOPE_GEMM_CACHE=/tmp/w1/gemm-algorithms.json; W=/tmp/ab; rm -rf $W; mkdir -p $W
for preset in "small" "seed --batch 32" "llama-1b"; do name=${preset%% *}; steps=30; [ $name = llama-1b ] && steps=10
  for g in 0 1; do
    FP8SCOPE_GRAPH=$g timeout 70 bin/fp8-capture train --quiet --device cuda --preset $preset --recipe delayed --steps $steps --out $W/$name-g$g > $W/$name-g$g.log 2>&1
    echo "$name graphs=$g rc $?: $(python3 bench/runs.py speed $W/$name-g$g --skip 4 | grep -oE '"median_ms": [0-9.]+')" | tee -a $OUT/ab.txt
  done
  python3 bench/runs.py same $W/$name-g0 $W/$name-g1 | tee -a $OUT/ab.txt; date +%T
done
