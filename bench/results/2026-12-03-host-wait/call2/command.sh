# Call 2: where inside a step the GPU waits for the host (FP8SCOPE_PROFILE=1 now prints the GPU's
# idle time between top-level spans, by the span it waited for), plain and with the GPU held at
# each step's start (FP8SCOPE_LEAD_US: then the host's columns are its own costs, with no wait for
# the device); then bench/gpu_check.sh on this build (the norms' f64 chunk reduction included).
set -u
cd gpu-bundle
W=/tmp/w; mkdir -p $W/p
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
prof() {  # name lead_us args...
  local name=$1 lead=$2; shift 2
  FP8SCOPE_LEAD_US=$lead FP8SCOPE_PROFILE=1 timeout 80 bin/fp8-capture train --quiet --device cuda --out $W/p/$name "$@" > /dev/null 2> $W/p/profile_$name.txt
  echo "== $name rc $?"; sed -n '/GPU idle/,$p' $W/p/profile_$name.txt
}
prof llama-bf16 0 --preset llama-1b --steps 8 --recipe bf16
prof llama-delayed 0 --preset llama-1b --steps 8 --recipe delayed
prof llama-bf16-held 150000 --preset llama-1b --steps 8 --recipe bf16
prof seed-b32-bf16 0 --preset seed --batch 32 --steps 10 --recipe bf16
prof seed-b32-delayed 0 --preset seed --batch 32 --steps 10 --recipe delayed
date +%T
timeout 300 bash bench/gpu_check.sh bin $W/gc > $W/gpu_check.txt 2>&1; echo "gpu_check rc $?"
grep -E "test result|FAILED|panicked|parity|same|status" $W/gpu_check.txt | cut -c1-300
date +%T
cd $W && tar czf $OUT/results.tgz --exclude='*.parquet' p/*.txt gpu_check.txt gc/*.jsonl gc/*.log 2>/dev/null
