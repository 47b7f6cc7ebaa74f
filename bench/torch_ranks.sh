#!/usr/bin/env bash
# The PyTorch recorder in a distributed job, on a GPU machine with torch and torchao: under torchrun
# with one process per GPU (NCCL), bench/torch_ranks.py's seed-shaped model with torchao's real FP8
# Float8Linear, wrapped in DDP and in FSDP2: the step time without the recorder, with fp8scope's
# statistics only, with the casts table and with the cast audit at every step (stats every 1 and 10
# steps); then 100 recorded steps to measure the bytes each rank writes per step and the size of its
# parts, and the audits' totals (every one must match on a clean run).
#
# Usage: bench/torch_ranks.sh OUT [NPROC]
#   OUT    folder for the logs (and the recorded runs, under OUT/runs)
#   NPROC  processes (default: every GPU)
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUT [NPROC]" >&2; exit 2; }
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
NPROC=${2:-$(python3 -c 'import torch; print(max(1, torch.cuda.device_count()))')}
mkdir -p "$OUT/runs"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
run() {  # run NAME ARGS…: one torchrun launch, its log in OUT/NAME.log
  local name=$1; shift
  python3 -m torch.distributed.run --nproc-per-node "$NPROC" --master-port $((29500 + RANDOM % 1000)) \
    "$HERE/torch_ranks.py" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name (exit $rc)"; grep -v RESULT "$OUT/$name.log" | grep -v -i "warn" | tail -12
  return $rc
}
fail=0
run overhead_ddp overhead --wrap ddp --out "$OUT/runs" || fail=1
run overhead_fsdp overhead --wrap fsdp --out "$OUT/runs" || fail=1
run bytes_ddp bytes --wrap ddp --out "$OUT/runs" --steps 100 --flush-every 25 || fail=1
run bytes_ddp_stats10 bytes --wrap ddp --out "$OUT/runs" --steps 100 --flush-every 25 --stats-every 10 || fail=1
grep -h RESULT "$OUT"/*.log | sed 's/^RESULT //' >"$OUT/results.jsonl"
exit $fail
