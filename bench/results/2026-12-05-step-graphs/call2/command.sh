# Planned call 2: the step in CUDA graphs against launch by launch, one binary, side by side
# (FP8SCOPE_GRAPH=1 through bench/env_bin.sh). llama-1b: every table of small and llama-small
# compared (compare_builds.sh tables), then delayed with and without statistics, 2 rounds
# interleaved; the seed preset at batch 32 and small at its own batch, where launches weigh more:
# 30 steps each way, 2 rounds, median ms of steps 5 on. Then one graphed run's own count of
# what it graphed (FP8SCOPE_VERBOSE). About 8 minutes.
set -u
cd gpu-bundle
W=/tmp/graphs; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
bash bench/env_bin.sh bin graph FP8SCOPE_GRAPH=1
PARTS="speed" bash bench/compare_builds.sh bin graph $OUT/llama-1b 2>&1 | tee $OUT/llama-1b.txt | tail -12
for preset in "seed --batch 32" "small"; do
  name=${preset%% *}
  for round in 1 2; do
    for v in bin graph; do
      run=$W/$name-$v-$round
      timeout 120 $v/fp8-capture train --quiet --device cuda --preset $preset --recipe delayed --steps 30 --out $run > $run.log 2>&1
      echo "$name $v round $round rc $?: $(python3 bench/runs.py speed $run --skip 5 | grep -oE '"median_ms": [0-9.]+')"
    done
  done
  python3 bench/runs.py same $W/$name-bin-1 $W/$name-graph-1 | tail -2
done
FP8SCOPE_VERBOSE=1 timeout 120 graph/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $W/verbose 2>&1 | grep -E "CUDA graphs"
date +%T
