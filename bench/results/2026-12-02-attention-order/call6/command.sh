# Call 6: dK/dV with three buffers of q and dout (one barrier an iteration) against the kept kernels (prev, dcdfad0), kernel by kernel
for shape in 4,2048,32,8,64 32,512,16,16,64 4,2048,16,4,128 8,128,8,8,32; do
  python3 bench/flash_bench.py $OUT/s_${shape//,/_}.json $(cat gpu-bundle/fv6/all.txt) --shape $shape --rounds 3
done
