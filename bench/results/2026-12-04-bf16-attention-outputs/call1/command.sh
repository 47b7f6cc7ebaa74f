# Call 1: the attention's output (both families) and GPT's dqkv held in 16 bits, cast by the
# computed-source kernel SRC_BF16; current scaling's amax pass by the computed sources' own kernels.
# prev (45e8561's engine) against bin (the change): the tests, the kernels alone (f32 against
# 16-bit outputs), every table bit for bit (seed b32 BF16 / delayed / current, llama-1b BF16 /
# delayed, small / llama-small with every layer dumped and shadow GEMMs, delayed and current),
# seed b32 steps interleaved, profiles.
set -u
cd gpu-bundle
W=/tmp/w; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 240 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|compared bit for bit|outputs and reports|fused vs unfused|attention forward" $W/cuda_layers.txt | head -60
date +%T
timeout 100 python3 bench/flash_bench.py $W/flash_seed.json old=fv/old.cubin:2:2:rows:f32-args f32=fv/new.cubin:2:2:rows out16=fv/new.cubin:2:2:rows:out16 --shape 32,512,16,16,64 --rounds 3 --no-rope 2>&1 | tail -5
timeout 100 python3 bench/flash_bench.py $W/flash_llama.json old=fv/old.cubin:2:2:f32-args new=fv/new.cubin:2:2 --shape 4,2048,32,8,64 --rounds 3 2>&1 | tail -4
date +%T
run() {  # build name args...
  local b=$1 name=$2; shift 2
  timeout 120 $b/fp8-capture train --quiet --device cuda --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"
}
med() { python3 bench/runs.py speed $W/r/$1 --skip 10 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
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
for s in bf16 delayed; do
  for v in prev bin; do run $v $v-l-$s --preset llama-1b --steps 16 --recipe $s; done
  echo "llama-1b $s: prev $(python3 bench/runs.py speed $W/r/prev-l-$s --skip 6 | grep -oE '"median_ms": [0-9.]+') bin $(python3 bench/runs.py speed $W/r/bin-l-$s --skip 6 | grep -oE '"median_ms": [0-9.]+')"
done
for t in bf16-1 bf16-nostats-1 delayed-1 current l-bf16 l-delayed; do
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
timeout 200 bash bench/dump_shadow_check.sh prev bin $W/tables cuda > $W/tables.txt 2>&1; echo "dump_shadow_check rc $?"
grep -E '^(small|llama-small):' $W/tables.txt | cut -c1-400
for p in small llama-small; do
  for v in prev bin; do
    timeout 100 $v/fp8-capture train --quiet --device cuda --preset $p --recipe current --steps 20 --dump-every 5 --dump-layers '.' --shadow --out $W/tables/$p-current-$v > /dev/null 2>&1 || echo "$p current $v failed"
  done
  echo -n "$p current, dumps and shadow: "; python3 bench/runs.py tables $W/tables/$p-current-prev $W/tables/$p-current-bin | cut -c1-400
done
date +%T
cd $W && tar czf $OUT/results.tgz cuda_layers.txt flash_*.json profile_*.txt tables.txt r/*.log 2>/dev/null
