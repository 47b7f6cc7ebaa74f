# Planned: what the kernel cache saves a GPU run at start-up. Two short runs of `small` with one
# empty FP8SCOPE_KERNEL_CACHE: the first compiles every kernel with NVRTC and keeps the CUBINs,
# the second reads them. Whole-process wall seconds of each, and the step rows of both compared
# (the kept CUBINs must give the compiled ones' bits).
set -u
cd gpu-bundle
K=/tmp/kc; rm -rf $K /tmp/kc-run*
for i in 1 2; do
  s=$(date +%s.%N)
  FP8SCOPE_KERNEL_CACHE=$K bin/fp8-capture train --quiet --device cuda --preset small --steps 20 --out /tmp/kc-run$i
  echo "run $i: rc $? in $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s; cache: $(ls $K | wc -l) files, $(du -sh $K | cut -f1)"
done
python3 bench/runs.py same /tmp/kc-run1 /tmp/kc-run2 2>&1 | tail -3
