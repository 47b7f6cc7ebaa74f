# Call 1: where the peers' steps go (bench/peer_profile.py: torch.profiler over the steps each peer
# times) beside this engine's FP8SCOPE_PROFILE=1 spans, BF16 and delayed, with and without statistics.
set -u
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$OUT/gemm-algorithms.json
R=/tmp/runs; mkdir -p $R
echo "== peer seed b32"; date +%T
timeout 200 python3 bench/peer_profile.py bench/torch_tiny.py --variant compile_fused --batch 32 --steps 5 > $OUT/peer_b32.txt 2>&1; echo "rc $?"
grep -v "^  *[0-9]" $OUT/peer_b32.txt | tail -3; sed -n '/peer GPU profile/,/total/p' $OUT/peer_b32.txt
for spec in "bf16 --stats-every 0" "bf16" "delayed"; do
  set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"
  FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 8 --recipe $r "$@" --out $R/b32-$tag > $OUT/ours_b32_$tag.txt 2>&1
  echo "== ours b32 $tag rc $?"; grep total $OUT/ours_b32_$tag.txt
done
echo "== peer llama-1b"; date +%T
timeout 300 python3 bench/peer_profile.py bench/torch_llama.py --preset llama-1b --warmup 5 --steps 3 > $OUT/peer_llama.txt 2>&1; echo "rc $?"
grep -v "^  *[0-9]" $OUT/peer_llama.txt | tail -3; sed -n '/peer GPU profile/,/total/p' $OUT/peer_llama.txt
for spec in "bf16 --stats-every 0" "delayed"; do
  set -- $spec; r=$1; shift; tag="$r${1:+-nostats}"
  FP8SCOPE_PROFILE=1 timeout 100 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 6 --recipe $r "$@" --out $R/l-$tag > $OUT/ours_llama_$tag.txt 2>&1
  echo "== ours llama $tag rc $?"; grep total $OUT/ours_llama_$tag.txt
done
date +%T
