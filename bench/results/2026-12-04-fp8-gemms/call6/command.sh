# Call 6: FP8 in PyTorch at llama-1b: Hugging Face's Llama under torch.compile with every decoder
# projection in FP8 (bench/torch_fp8_peer.py --model llama-1b) against the same model in BF16
# (bench/torch_llama.py), one call.
set -u
cd gpu-bundle
date +%T
timeout 200 python3 bench/torch_fp8_peer.py --model llama-1b --warmup 5 --steps 10 2>&1 | tail -3 | tee $OUT/peer_llama_fp8.txt
date +%T
timeout 180 python3 bench/torch_llama.py --preset llama-1b --variant compile_fused --warmup 5 --steps 10 2>&1 | grep RESULT | tee $OUT/peer_llama_bf16.txt
date +%T
