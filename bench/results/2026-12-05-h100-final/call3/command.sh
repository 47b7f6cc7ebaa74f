# Call 3: bench/speed.sh b32 on f863bef's build (graphs on by default), against torch_tiny.py.
set -u
cd gpu-bundle
W=/tmp/w2; mkdir -p $W; export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T; timeout 575 bash bench/speed.sh bin $OUT/s b32 > $OUT/speed.txt 2>&1; echo "speed rc $?"
tail -40 $OUT/speed.txt; date +%T
