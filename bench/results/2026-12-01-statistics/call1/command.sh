set -u
O=$OUT
cd gpu-bundle
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
echo "== profile llama-1b (fb95d03)"
timeout 330 bash bench/llama_profile.sh bin $O/prof llama-1b 2>&1 | grep -vE "^\s*$"
echo "== ncu channel stats + casts"
timeout 200 bash bench/ncu_kernels.sh bin $O/ncu llama-1b delayed '^(channel_stats_partial|channel_stats_reduce|cast_fwd_l[01]_f1_t2|cast_fwd_l[01]_f1_t0)$' 2 | grep -E "^  [a-z_0-9]+ \(|Duration|Memory Throughput.*byte|Grid Size|Block Size" | head -80
