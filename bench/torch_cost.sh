#!/usr/bin/env bash
# The PyTorch recorder's cost on one GPU, in one call of at most 9 minutes: step time with and
# without the recorder (statistics every step, dumps every 50 steps) for bench/torch_tiny.py's model
# and Hugging Face LlamaForCausalLM at the llama-small and llama-1b shapes, eager and under
# torch.compile, BF16 and torchao Float8Linear (bench/torch_cost.py says how).
#
# Usage: bench/torch_cost.sh [OUT]     (OUT: default $OUT, else ./out)
# Writes OUT/torch_cost.json, OUT/torch_cost.md and OUT/torch_cost.log; prints the markdown table.
# Needs torch with CUDA, transformers, torchao, pyarrow; no network, no Rust.
set -uo pipefail
OUT=${1:-${OUT:-./out}}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$HERE/../python${PYTHONPATH:+:$PYTHONPATH}"
# 480 s of configurations, then the files; the whole call stays under 9 minutes.
timeout 530 python3 "$HERE/torch_cost.py" --out "$OUT" --budget-s 480 "${@:2}" >"$OUT/torch_cost.log" 2>&1
rc=$?
grep -v '^{' "$OUT/torch_cost.log" | grep -E "^\||^Recorder|^Before|skip|Error" | tail -20
[ $rc -eq 124 ] && echo "torch_cost.sh: stopped at 530 s; $OUT/torch_cost.log has the configurations measured" >&2
exit $rc
