#!/bin/bash
# call1: the fused attention's variants, kernel by kernel (bench/flash_bench.py), llama-1b's shape and seed's
set -x
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
python3 bench/flash_bench.py $OUT/llama.json $(cat gpu-bundle/fv/all.txt) --rounds 3
python3 bench/flash_bench.py $OUT/seed_b32.json $(cat gpu-bundle/fv/all.txt) --shape 32,512,16,16,64 --rounds 3
