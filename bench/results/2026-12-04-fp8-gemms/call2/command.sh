# Call 2: FP8's speed-up in PyTorch at seed b32 (torch.compile; every encoder GEMM in FP8 through
# torch._scaled_mm, bench/torch_fp8_peer.py; and torch_tiny.py's forward-only FP8) beside ours,
# side by side in one call.
set -u
cd gpu-bundle
W=/tmp/w2; rm -rf $W; mkdir -p $W/r
export FP8SCOPE_GEMM_CACHE=$W/gemm-algorithms.json
date +%T
ours() {  # name args...
  local name=$1; shift
  timeout 120 bin/fp8-capture train --quiet --device cuda --preset seed --batch 32 --steps 30 --out $W/r/$name "$@" > $W/r/$name.log 2>&1 || echo "$name failed: $(tail -1 $W/r/$name.log)"
  echo "ours $name: $(python3 bench/runs.py speed $W/r/$name --skip 10 | grep -oE '"median_ms": [0-9.]+')"
}
ours warm --recipe delayed --stats-every 0 > /dev/null
python3 bench/torch_tiny.py --variant compile_fused --batch 32 --warmup 10 --steps 30 2>&1 | grep RESULT | tee $W/peer_bf16_1.txt
date +%T
python3 bench/torch_fp8_peer.py --batch 32 --warmup 10 --steps 30 2>&1 | tail -3 | tee $W/peer_fp8_full_1.txt
date +%T
for i in 1 2; do
  ours bf16-nostats-$i --recipe bf16 --stats-every 0
  ours delayed-nostats-$i --recipe delayed --stats-every 0
  ours current-nostats-$i --recipe current --stats-every 0
done
python3 bench/torch_tiny.py --variant fp8_compile_fused --fast-accum --batch 32 --warmup 10 --steps 30 2>&1 | grep RESULT | tee $W/peer_fp8_fwd_1.txt
python3 bench/torch_tiny.py --variant compile_fused --batch 32 --warmup 10 --steps 30 2>&1 | grep RESULT | tee $W/peer_bf16_2.txt
python3 bench/torch_fp8_peer.py --batch 32 --warmup 10 --steps 30 2>&1 | tail -3 | tee $W/peer_fp8_full_2.txt
date +%T
cd $W && tar czf $OUT/results.tgz *.txt r/*.log 2>/dev/null
