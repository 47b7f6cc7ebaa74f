# Call 4: the seed b32 targets side by side with torch.compile (bench/speed.sh b32), then the channel
# cadence's cost at llama-1b over 3 more pairs (call 3 ran one).
set -u
cd gpu-bundle
W=/tmp/w4; rm -rf $W; mkdir -p $W
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 330 bash bench/speed.sh bin $W/s b32 > $W/b32.txt 2>&1; echo "speed.sh rc $?"
tail -14 $W/b32.txt
date +%T
VARIANTS="--channel-stats-every 1;--channel-stats-every 10" timeout 200 bash bench/stats_cost.sh bin $W/scl llama-1b delayed 3 12 2>&1 | tee $W/stats_cost_llama.txt
date +%T
cp $W/b32.txt $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/stats_cost_llama.txt $OUT/ 2>/dev/null
