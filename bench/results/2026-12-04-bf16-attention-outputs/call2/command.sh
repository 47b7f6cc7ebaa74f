# Call 2: as call 1's change, plus BF16 operands of BF16 buffers read by the GEMMs as they are (the
# cast kernel computes only their statistics and column sums, and writes no copy). prev (45e8561's
# engine) against bin: the tests, every table bit for bit, seed b32 steps interleaved (BF16 with
# and without statistics, delayed, current), llama-1b BF16 and delayed, profiles.
set -u
cd gpu-bundle
W=/tmp/w; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 240 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|compared bit for bit|outputs and reports equal" $W/cuda_layers.txt | head -30
date +%T
run() {  # build name args...
  local b=$1 name=$2; shift 2
  timeout 120 $b/fp8-capture train --quiet --device cuda --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"
}
med() { python3 bench/runs.py speed $W/r/$1 --skip ${2:-10} | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2 3; do
  for s in bf16 bf16-nostats delayed; do
    extra=(--recipe ${s%-nostats}); [ $s = bf16-nostats ] && extra+=(--stats-every 0)
    line="seed b32 $s round $i:"
    for v in prev bin; do
      run $v $v-$s-$i --preset seed --batch 32 --steps 30 "${extra[@]}"
      line="$line $v $(med $v-$s-$i)"
    done
    echo "$line"
  done
done
for v in prev bin; do run $v $v-current --preset seed --batch 32 --steps 30 --recipe current; done
echo "seed b32 current: prev $(med prev-current) bin $(med bin-current)"
for i in 1 2; do
  for v in prev bin; do run $v $v-l-bf16-$i --preset llama-1b --steps 16 --recipe bf16; done
  echo "llama-1b bf16 round $i: prev $(med prev-l-bf16-$i 6) bin $(med bin-l-bf16-$i 6)"
done
for t in bf16-1 bf16-nostats-1 delayed-1 current l-bf16-1; do
  echo -n "tables $t, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-$t $W/r/bin-$t | cut -c1-600
done
date +%T
for s in bf16 delayed; do
  for v in prev bin; do
    FP8SCOPE_PROFILE=1 timeout 60 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe $s --out $W/r/prof-$s-$v > /dev/null 2> $W/profile_seed_${s}_$v.txt
    echo "-- profile $s $v"; grep -E "^  (gemm.cast|attention|total)" $W/profile_seed_${s}_$v.txt
  done
done
date +%T
timeout 100 bash bench/dump_shadow_check.sh prev bin $W/tables cuda > $W/tables.txt 2>&1; echo "dump_shadow_check rc $?"
grep -E '^(small|llama-small):' $W/tables.txt | cut -c1-400
date +%T
cd $W && tar czf $OUT/results.tgz cuda_layers.txt profile_*.txt tables.txt r/*.log 2>/dev/null
