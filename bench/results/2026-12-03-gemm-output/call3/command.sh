# Call 3: the GEMM output change (bias in cuBLASLt's epilogue, the non-finite count only when it
# can be non-zero) against prev (beca82c's engine): the GPU tests, then llama-1b delayed from each
# binary with every table compared, then profiles of the new binary.
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
timeout 150 bin/cuda_layers --test-threads 1 > $OUT/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|non-finite counts checked" $OUT/cuda_layers.txt | head
for b in prev bin; do
  timeout 100 $b/fp8-capture train --quiet --device cuda --preset llama-1b --steps 12 --recipe delayed --out $R/l-$b > $OUT/llama_$b.txt 2>&1
  echo "== llama-1b delayed $b rc $?"; python3 bench/runs.py speed $R/l-$b --skip 4
done
python3 bench/runs.py tables $R/l-prev $R/l-bin 2>&1 | tail -4
for p in "seed --batch 32" "llama-1b"; do
  for spec in "bf16 --stats-every 0" "delayed"; do
    set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"; pt=${p%% *}
    FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset $p --steps 7 --recipe $r "$@" --out $R/$pt-$tag > $OUT/profile_${pt}_$tag.txt 2>&1
    echo "== profile $pt $tag rc $?"; grep -E "gemm|total" $OUT/profile_${pt}_$tag.txt
  done
done
