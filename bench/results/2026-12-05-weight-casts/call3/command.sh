# Call 3: the weights' casts in one launch against one a weight, in one binary
# (FP8SCOPE_WEIGHT_CASTS=each through bench/env_bin.sh), llama-1b, interleaved; then the channel
# cadence's cost (every step against every 10th, each against its round's run without statistics)
# at seed b32 and at llama-1b.
set -u
cd gpu-bundle
W=/tmp/w3; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
bash bench/env_bin.sh $PWD/bin $PWD/each FP8SCOPE_WEIGHT_CASTS=each
date +%T
PARTS="speed" timeout 220 bash bench/compare_builds.sh each bin $W/ab 2>&1 | tee $W/ab.txt | cut -c1-300
date +%T
RUN_FLAGS="--batch 32" VARIANTS="--channel-stats-every 1;--channel-stats-every 10" timeout 190 bash bench/stats_cost.sh bin $W/sc seed delayed 3 12 2>&1 | tee $W/stats_cost_seed.txt
date +%T
VARIANTS="--channel-stats-every 1;--channel-stats-every 10" timeout 140 bash bench/stats_cost.sh bin $W/scl llama-1b delayed 1 12 2>&1 | tee $W/stats_cost_llama.txt
date +%T
cp $W/ab.txt $W/stats_cost_seed.txt $W/stats_cost_llama.txt $OUT/ 2>/dev/null; cp $W/ab/*.txt $OUT/ 2>/dev/null
