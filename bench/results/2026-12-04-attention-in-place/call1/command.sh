# Call 1: the fused attention reads BF16 qkv and dout rows in place (no attention_split_fwd /
# _bwd pass for GPT), prev (2f11c17's engine) against bin (the change): the tests, the kernels
# alone (old CUBIN against new, head-major and in place), every table bit for bit at seed b32 BF16
# and on small / llama-small, seed b32 BF16 steps interleaved, profiles.
set -u
cd gpu-bundle
W=/tmp/w; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 200 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|compared bit for bit|fused vs unfused|attention forward" $W/cuda_layers.txt | head -40
date +%T
for shape in 32,512,16,16,64 4,2048,32,8,64; do
  timeout 120 python3 bench/flash_bench.py $W/flash_$shape.json old=fv/old.cubin:2:2:ptr-args new=fv/new.cubin:2:2 new_rows=fv/new.cubin:2:2:rows --shape $shape --rounds 3 2>&1 | tail -5
done
date +%T
run() {  # build name args...
  local b=$1 name=$2; shift 2
  timeout 100 $b/fp8-capture train --quiet --device cuda --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"
}
med() { python3 bench/runs.py speed $W/r/$1 --skip 10 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2 3; do
  for s in stats nostats; do
    extra=(); [ $s = nostats ] && extra=(--stats-every 0)
    line="seed b32 bf16 $s round $i:"
    for v in prev bin; do
      run $v $v-$s-$i --preset seed --batch 32 --steps 30 --recipe bf16 "${extra[@]}"
      line="$line $v $(med $v-$s-$i)"
    done
    echo "$line"
  done
done
for v in prev bin; do run $v $v-delayed --preset seed --batch 32 --steps 30 --recipe delayed; done
echo "seed b32 delayed: prev $(med prev-delayed) bin $(med bin-delayed)"
echo -n "tables seed b32 bf16 stats, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-stats-1 $W/r/bin-stats-1 | cut -c1-600
echo -n "tables seed b32 bf16 nostats, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-nostats-1 $W/r/bin-nostats-1 | cut -c1-600
echo -n "tables seed b32 delayed, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-delayed $W/r/bin-delayed | cut -c1-600
date +%T
for v in prev bin; do
  FP8SCOPE_PROFILE=1 timeout 60 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe bf16 --out $W/r/prof-$v > /dev/null 2> $W/profile_seed_bf16_$v.txt
  echo "-- profile $v"; grep -E "^  (attention|total)" $W/profile_seed_bf16_$v.txt
done
date +%T
timeout 200 bash bench/dump_shadow_check.sh prev bin $W/tables cuda > $W/tables.txt 2>&1; echo "dump_shadow_check rc $?"
grep -E '^(small|llama-small):' $W/tables.txt | cut -c1-400
date +%T
cd $W && tar czf $OUT/results.tgz cuda_layers.txt flash_*.json profile_*.txt tables.txt r/*.log 2>/dev/null
