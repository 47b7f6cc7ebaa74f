# Call 1: how long the GPU waits for the host's launches in a step (bench/host_wait.sh: each case
# plain and with the GPU held at the start of every step), then where llama-1b BF16's statistics
# cost goes (FP8SCOPE_PROFILE=1, with statistics and without). Files beyond output.txt go into
# results.tgz.
set -u
cd gpu-bundle
W=/tmp/w; mkdir -p $W/hw $W/p
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
HOST_WAIT_DIR=$W/hw timeout 430 bash bench/host_wait.sh bin 60 150; echo "host_wait rc $?"
date +%T
for s in 1 0; do
  FP8SCOPE_PROFILE=1 timeout 70 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 8 --recipe bf16 \
    --stats-every $s --out $W/p/l-bf16-s$s > /dev/null 2> $W/p/profile_llama_bf16_stats$s.txt; echo "profile stats-every $s rc $?"
done
date +%T
cd $W && tar czf $OUT/results.tgz --exclude='*.parquet' hw/*.log p/*.txt gemm-algorithms.json
