set -u
O=$OUT
cd gpu-bundle
echo "== cuda_layers"
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $O/test_cuda_layers.txt 2>&1; echo "rc $?"
grep -E "test result|FAILED|panicked|reduced_together" $O/test_cuda_layers.txt | head -10
echo "== every table, old vs new (dump_shadow_check)"
timeout 150 bash bench/dump_shadow_check.sh old bin $O/dsc cuda 2>&1 | tail -3
echo "== speed llama-1b 12 steps, old then new"
for spec in "delayed" "delayed --stats-every 0" "bf16"; do
  set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"
  for v in old new; do
    bin=bin; [ $v = old ] && bin=old
    timeout 150 $bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe $r "$@" --steps 12 --out $O/runs/$tag-$v > $O/$tag-$v.txt 2>&1
    echo "-- $tag $v: $(python3 bench/runs.py speed $O/runs/$tag-$v --skip 4 | grep -oE '"median_ms": [0-9.]+')"
  done
  python3 bench/runs.py same $O/runs/$tag-old $O/runs/$tag-new
done
echo "== profile new, delayed"
FP8SCOPE_PROFILE=1 timeout 120 bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 8 --out $O/runs/p-delayed > $O/prof-delayed.txt 2>&1
grep -E "gemm|reports|total|adamw|sumsq" $O/prof-delayed.txt
