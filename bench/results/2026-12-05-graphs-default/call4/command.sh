# Call 4 (the same machine): two more rounds of call 3's llama-1b and seed b32 pairs, graphs first.
cd gpu-bundle && export FP8SCOPE_GEMM_CACHE=/tmp/w1/gemm-algorithms.json; W=/tmp/ab2; rm -rf $W; mkdir -p $W
for r in 2 3; do for preset in "llama-1b" "seed --batch 32"; do name=${preset%% *}; steps=30; [ $name = llama-1b ] && steps=10
  for g in 1 0; do
    FP8SCOPE_GRAPH=$g timeout 60 bin/fp8-capture train --quiet --device cuda --preset $preset --recipe delayed --steps $steps --out $W/$name-g$g-$r > /dev/null 2>&1
    echo "round $r $name graphs=$g rc $?: $(python3 bench/runs.py speed $W/$name-g$g-$r --skip 4 | grep -oE '"median_ms": [0-9.]+')" | tee -a $OUT/ab2.txt
  done
done; date +%T; done
