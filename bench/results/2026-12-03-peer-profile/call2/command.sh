# Call 2: this engine's profile with the GEMM span split (gemm.matmul, gemm.epilogue, gemm.bias_grad).
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
for p in "seed --batch 32" "llama-1b"; do
  for spec in "bf16 --stats-every 0" "delayed"; do
    set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"; pt=${p%% *}
    FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset $p --steps 7 --recipe $r "$@" --out $R/$pt-$tag > $OUT/ours_${pt}_$tag.txt 2>&1
    echo "== ours $pt $tag rc $?"; grep -E "gemm|total" $OUT/ours_${pt}_$tag.txt
  done
done
