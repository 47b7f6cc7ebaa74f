# Call 4: why call 3's statistics share rose (delayed with statistics every step against none):
# prev (45e8561's engine) against bin (2e44444's), seed b32 delayed with and without statistics,
# interleaved, and their profiles.
set -u
cd gpu-bundle
W=/tmp/w4; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
run() {  # build name args...
  local b=$1 name=$2; shift 2
  timeout 120 $b/fp8-capture train --quiet --device cuda --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"
}
med() { python3 bench/runs.py speed $W/r/$1 --skip 10 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
for i in 1 2 3; do
  for s in delayed delayed-nostats; do
    extra=(--recipe delayed); [ $s = delayed-nostats ] && extra+=(--stats-every 0)
    line="seed b32 $s round $i:"
    for v in prev bin; do
      run $v $v-$s-$i --preset seed --batch 32 --steps 30 "${extra[@]}"
      line="$line $v $(med $v-$s-$i)"
    done
    echo "$line"
  done
done
echo -n "tables delayed-nostats-1, prev vs bin: "; python3 bench/runs.py tables $W/r/prev-delayed-nostats-1 $W/r/bin-delayed-nostats-1 | cut -c1-300
date +%T
for s in stats nostats; do
  extra=(); [ $s = nostats ] && extra=(--stats-every 0)
  for v in prev bin; do
    FP8SCOPE_PROFILE=1 timeout 60 $v/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 10 --recipe delayed "${extra[@]}" --out $W/r/prof-$s-$v > /dev/null 2> $W/profile_seed_delayed_${s}_$v.txt
    echo "-- profile delayed $s $v"; grep -E "^  (gemm|attention|total)" $W/profile_seed_delayed_${s}_$v.txt | head -12
  done
done
date +%T
cd $W && tar czf $OUT/results.tgz profile_*.txt r/*.log 2>/dev/null
