# One call on a fresh H100 (80 GB HBM3), bundle from bench/stage.sh (XZ=1) at 484727a's build
# (the capture and test binaries; the analyzer was not needed): gpu_check.sh (the CUDA test
# binaries, cuda_layers' accumulator measurement included; small and llama-small parity with the
# CPU; bit-identical reruns), then speed.sh llama with one interleaved round, side by side with
# torch_llama.py (HF Llama under torch.compile).
for f in gpu-bundle/bin/*.xz; do xz -d $f; done; chmod +x gpu-bundle/bin/*; cp -r bench gpu-bundle/bench; cd gpu-bundle
W=/tmp/w1; mkdir -p $W; export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
timeout 280 bash bench/gpu_check.sh bin $OUT/g > $OUT/gpu_check.txt 2>&1
export FP8SCOPE_GEMM_CACHE=$W/gemm2.json
STATS_ROUNDS=1 SPEED_TIMEOUT=120 timeout 250 bash bench/speed.sh bin $OUT/s llama > $OUT/speed.txt 2>&1
