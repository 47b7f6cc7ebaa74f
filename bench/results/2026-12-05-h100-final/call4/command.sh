# Call 4 (a fresh machine): (1) what the kernel cache saves a run at start-up (two `small` runs
# with one empty FP8SCOPE_KERNEL_CACHE, rows compared); (2) SwiGLU's backward cast with its
# channel partials over runs (FP8SCOPE_PAIR_RUNS=1) against the default, one binary:
# compare_builds.sh's tests, tables and llama-1b speed with and without statistics (2 rounds);
# (3) a profiled llama-1b delayed run (the GPU's idle time between steps).
set -u
cd gpu-bundle
date +%T; nvidia-smi --query-gpu=name --format=csv,noheader
export FP8SCOPE_GEMM_CACHE=/tmp/gemm-algorithms.json
K=/tmp/kc; rm -rf $K /tmp/kc-run*
for i in 1 2; do
  s=$(date +%s.%N)
  FP8SCOPE_KERNEL_CACHE=$K timeout 150 bin/fp8-capture train --quiet --device cuda --preset small --steps 20 --out /tmp/kc-run$i
  echo "run $i: rc $? in $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s; cache: $(ls $K | wc -l) files, $(du -sh $K | cut -f1)"
done | tee $OUT/kernel_cache.txt
python3 bench/runs.py same /tmp/kc-run1 /tmp/kc-run2 2>&1 | tail -3 | tee -a $OUT/kernel_cache.txt
export FP8SCOPE_KERNEL_CACHE=$K
date +%T
bash bench/env_bin.sh bin runs FP8SCOPE_PAIR_RUNS=1
PARTS="tests tables speed" ROUNDS=2 timeout 400 bash bench/compare_builds.sh bin runs $OUT/pair > $OUT/pair_runs.txt 2>&1; echo "compare_builds rc $?"
cat $OUT/pair_runs.txt | cut -c1-400
date +%T
FP8SCOPE_PROFILE=1 timeout 75 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 10 --out /tmp/prof > $OUT/profile_llama_delayed.txt 2>&1; echo "profile rc $?"
grep -iE "idle|wall|total" $OUT/profile_llama_delayed.txt | head -12
date +%T
