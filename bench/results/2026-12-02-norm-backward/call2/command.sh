# Call 2: three builds interleaved on llama-1b and seed b32 (delayed, 10 / 12 steps): old (fe838a9's
# code), a (fa7c5d4: LayerNorm's backward in one pass, the staged chunk reduction, AdamW 4-wide) and
# bin (a, plus the normalizations' backward keeping a chunk's BF16 dout in shared memory); the
# layer tests of bin; profiles of a and bin.
set -u
O=$OUT
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$O/gemm-algorithms.json
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bindir preset steps args...
  local n=$1 b=$2 p=$3 s=$4; shift 4
  timeout 150 $b/fp8-capture train --quiet --device cuda --preset $p --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo -n " $n $(med $R/$n)"
}
echo "== cuda_layers (bin)"
timeout 200 bin/cuda_layers --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"; grep -E "test result|FAILED|panicked" $O/cuda_layers.txt | head
echo "== llama-1b delayed, 10 steps, median ms"
for i in 1 2; do for b in old a bin; do run l-$b-$i $b llama-1b 10 --recipe delayed; done; done
echo; for b in a bin; do echo -n "losses old vs $b: "; python3 bench/runs.py same $R/l-old-1 $R/l-$b-1 | tail -1; done
echo "== seed b32 delayed, 12 steps"
for i in 1 2; do for b in old a bin; do run b-$b-$i $b seed 12 --recipe delayed --batch 32; done; done
echo; for b in a bin; do echo -n "losses old vs $b: "; python3 bench/runs.py same $R/b-old-1 $R/b-$b-1 | tail -1; done
echo "== profiles"
for b in a bin; do
  FP8SCOPE_PROFILE=1 timeout 150 $b/fp8-capture train --quiet --device cuda --preset llama-1b --steps 6 --recipe delayed --out $R/pl-$b > $O/profile_llama_$b.txt 2>&1
  FP8SCOPE_PROFILE=1 timeout 150 $b/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 8 --recipe delayed --out $R/pb-$b > $O/profile_b32_$b.txt 2>&1
done
grep -E "adamw|rmsnorm_bwd|layernorm_bwd|total" $O/profile_*.txt
