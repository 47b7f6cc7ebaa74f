# Call 5: FP8 bias gradients from dY's dual cast too (tile_column_sums_fp8): prev (b0a4cb6, the
# BF16 change) against bin. Tests; seed b32 FP8 delayed interleaved and its tables bit for bit;
# llama-1b delayed (no biases; the FP8 casts recompiled) likewise; small / llama-small tables; the
# seed b32 targets (speed.sh b32).
set -u
cd gpu-bundle
W=/tmp/w5; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 150 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|^n [0-9]+ (bf16|e4m3|e5m2)" $W/cuda_layers.txt | head -40
date +%T
run() { local b=$1 name=$2; shift 2
  timeout 100 $b/fp8-capture train --quiet --device cuda --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"; }
med() { python3 bench/runs.py speed $W/r/$1 --skip $2 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2 3; do
  for s in stats nostats; do
    extra=(); [ $s = nostats ] && extra=(--stats-every 0)
    line="seed b32 delayed $s round $i:"
    for v in prev bin; do run $v s-$v-$s-$i --preset seed --batch 32 --steps 30 --recipe delayed "${extra[@]}"; line="$line $v $(med s-$v-$s-$i 10)"; done
    echo "$line"
  done
done
echo -n "tables seed b32 delayed stats: "; python3 bench/runs.py tables $W/r/s-prev-stats-1 $W/r/s-bin-stats-1 | cut -c1-500
echo -n "tables seed b32 delayed nostats: "; python3 bench/runs.py tables $W/r/s-prev-nostats-1 $W/r/s-bin-nostats-1 | cut -c1-500
for i in 1 2; do
  line="llama-1b delayed round $i:"
  for v in prev bin; do run $v l-$v-$i --preset llama-1b --steps 12 --recipe delayed; line="$line $v $(med l-$v-$i 4)"; done
  echo "$line"
done
echo -n "tables llama-1b delayed: "; python3 bench/runs.py tables $W/r/l-prev-1 $W/r/l-bin-1 | cut -c1-500
date +%T
FP8SCOPE_PROFILE=1 timeout 60 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe delayed --out $W/r/prof > /dev/null 2> $W/profile_seed_delayed_bin.txt
grep -E "^  (gemm |gemm.cast |gemm.cast_dgelu|gemm.bias_grad|total)" $W/profile_seed_delayed_bin.txt
timeout 100 bash bench/dump_shadow_check.sh prev bin $W/tables cuda > $W/tables.txt 2>&1; echo "dump_shadow_check rc $?"
grep -E '^(small|llama-small):' $W/tables.txt | cut -c1-300
date +%T
bash bench/speed.sh bin $W/s b32 > $W/b32.txt 2>&1; echo "speed.sh rc $?"
grep -E "^- " $W/b32.txt
date +%T
cp $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/ 2>/dev/null
cd $W && tar czf $OUT/results.tgz cuda_layers.txt profile_*.txt tables.txt b32.txt speed.jsonl benchmarks_rows.md r/*.log 2>/dev/null
