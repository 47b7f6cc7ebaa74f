#!/bin/bash
# call2: heaviest tiles first, lse/delta rows by cp.async, forward with two query tiles; kernel by kernel
python3 bench/flash_bench.py $OUT/llama.json $(cat gpu-bundle/fv2/all.txt) --rounds 3
python3 bench/flash_bench.py $OUT/seed_b32.json $(cat gpu-bundle/fv2/all.txt) --shape 32,512,16,16,64 --rounds 3
python3 bench/flash_bench.py $OUT/small.json $(cat gpu-bundle/fv2/all.txt) --shape 8,128,8,8,32 --rounds 3 2>&1 | tail -3
