#!/usr/bin/env bash
# Where a GPU machine's time goes while something else runs: every INTERVAL seconds (default 30),
# the GPU's utilisation and memory and the busiest fp8scope processes (CPU share, seconds alive,
# command line), appended to FILE. Start it in the background and kill it when the work ends:
#     bash bench/probe.sh OUT/probe.log & PROBE=$!; ...; kill $PROBE
set -u
FILE=${1:?file}; INTERVAL=${2:-30}
while true; do
  {
    echo "== $(date +%T)"
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    ps -eo pcpu,etimes,args --sort=-pcpu | grep -E "fp8-(capture|analyze)" | grep -v grep | head -8 | cut -c1-220
  } >> "$FILE"
  sleep "$INTERVAL"
done
