# Call 5 (the same machine): call 4's profiled llama-1b delayed run without statistics, and with
# the channels every 10th step: the GPU's idle time between steps against call 4's.
set -u
cd gpu-bundle; export FP8SCOPE_GEMM_CACHE=/tmp/gemm-algorithms.json FP8SCOPE_KERNEL_CACHE=/tmp/kc
for v in "nostats --stats-every 0" "ch10 --channel-stats-every 10"; do n=${v%% *}; f=${v#* }
FP8SCOPE_PROFILE=1 timeout 75 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 $f --out /tmp/prof-$n > $OUT/profile_llama_delayed_$n.txt 2>&1; echo "$n profile rc $?"
grep -iE "idle|total" $OUT/profile_llama_delayed_$n.txt | head -6
done; date +%T
