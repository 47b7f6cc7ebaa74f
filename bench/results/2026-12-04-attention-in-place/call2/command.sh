# Call 2: flash_bwd_delta takes 8 rows a warp (loads in flight), bin (this change) against prev
# (a257333, call1's bin) and prev0 (2f11c17, before both): the tests, seed b32 BF16 tables and
# steps, llama-1b BF16 tables and steps (its dout is now read in place too), profiles, then the
# seed b32 targets side by side with torch.compile.
set -u
cd gpu-bundle
W=/tmp/w; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
timeout 200 bin/cuda_layers --nocapture --test-threads 1 > $W/cuda_layers.txt 2>&1; echo "cuda_layers rc $?"
grep -E "test result|FAILED|panicked|compared bit for bit|fused vs unfused|attention forward" $W/cuda_layers.txt | head -40
date +%T
run() {  # build name args...
  local b=$1 name=$2; shift 2
  timeout 100 $b/fp8-capture train --quiet --device cuda --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"
}
med() { python3 bench/runs.py speed $W/r/$1 --skip ${2:-10} | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2; do
  line="seed b32 bf16 stats round $i:"
  for v in prev bin; do
    run $v $v-seed-$i --preset seed --batch 32 --steps 30 --recipe bf16
    line="$line $v $(med $v-seed-$i)"
  done
  echo "$line"
done
echo -n "tables seed b32 bf16, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-seed-1 $W/r/bin-seed-1 | cut -c1-300
date +%T
for i in 1 2; do
  line="llama-1b bf16 stats round $i:"
  for v in prev0 prev bin; do
    run $v $v-llama-$i --preset llama-1b --steps 16 --recipe bf16
    line="$line $v $(med $v-llama-$i 6)"
  done
  echo "$line"
done
echo -n "tables llama-1b bf16, prev0 vs bin: "; python3 bench/runs.py tables $W/r/prev0-llama-1 $W/r/bin-llama-1 | cut -c1-300
date +%T
for v in prev bin; do
  FP8SCOPE_PROFILE=1 timeout 60 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe bf16 --out $W/r/prof-$v > /dev/null 2> $W/profile_seed_bf16_$v.txt
  echo "-- profile $v"; grep -E "^  (attention|total)" $W/profile_seed_bf16_$v.txt | head -3
done
date +%T
bash bench/speed.sh bin $W/s b32 > $W/b32.txt 2>&1; echo "speed.sh rc $?"
tail -22 $W/b32.txt
date +%T
cp $W/s/speed.jsonl $W/s/benchmarks_rows.md $W/b32.txt $OUT/ 2>/dev/null
cd $W && tar czf $OUT/results.tgz cuda_layers.txt profile_*.txt r/*.log 2>/dev/null
