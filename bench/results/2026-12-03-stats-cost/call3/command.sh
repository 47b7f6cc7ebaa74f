# Call 3 of the seventeenth pass: SwiGLU's backward casts stage their next tile in shared memory by
# cp.async (no registers held), so its loads overlap the cast. The layer tests on the new binary; llama-1b FP8
# delayed, old (dcdfad0, gpu-bundle/old) against new, with statistics and without, interleaved;
# every table of old against new; a profile of the new binary.
set -u
O=$OUT
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$O/gemm-algorithms.json
med() { python3 bench/runs.py speed "$1" --skip 4 | grep -oE '"median_ms": [0-9.]+' | grep -oE '[0-9.]+$'; }
R=/tmp/runs; mkdir -p $R
run() { # name bindir steps args...
  local n=$1 b=$2 s=$3; shift 3
  timeout 150 $b/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps $s --out $R/$n "$@" > $R/$n.log 2>&1 || tail -2 $R/$n.log
  echo "$n $(med $R/$n)"
}
echo "== cuda_layers"
timeout 240 bin/cuda_layers --test-threads 1 > $O/cuda_layers.txt 2>&1; echo "rc $?"; grep -E "test result|FAILED|panicked|within f64" $O/cuda_layers.txt | head -20
echo "== llama-1b delayed, 12 steps, median ms"
run old-s1 old 12; run new-s1 bin 12; run old-n1 old 12 --stats-every 0; run new-n1 bin 12 --stats-every 0
run old-s2 old 12; run new-s2 bin 12; run old-n2 old 12 --stats-every 0; run new-n2 bin 12 --stats-every 0
echo "== tables old vs new (with statistics)"; python3 bench/runs.py tables $R/old-s1 $R/new-s1 2>&1 | tail -12
echo "== tables old vs new (without)"; python3 bench/runs.py tables $R/old-n1 $R/new-n1 | tail -3
echo "== profile (new, statistics every step)"
FP8SCOPE_PROFILE=1 timeout 150 bin/fp8-capture train --quiet --device cuda --preset llama-1b --steps 8 --recipe delayed --out $R/pl > $O/profile_llama_stats1.txt 2>&1
grep -E "cast|total" $O/profile_llama_stats1.txt
