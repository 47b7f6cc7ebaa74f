#!/usr/bin/env bash
# Builds the fused attention's variants that bench/flash_bench.py times against each other: one
# CUBIN of kernels/flash_attention.cu per `variant` line below (NAME MT_FWD MT_DQ, then the -D
# flags), compiled for sm_90 by NVRTC on this machine (no GPU needed), with their registers and
# spills (bench/kernel_regs.py). Writes DEST/NAME.cubin and DEST/specs.txt, the arguments
# flash_bench.py takes.
# Usage: bench/flash_variants.sh DEST
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:?usage: bench/flash_variants.sh DEST}
mkdir -p "$DEST"
d64() { echo "$1(D)=((D) <= 64 ? $2 : 1)"; }
: > "$DEST/specs.txt"
# variant NAME MT_FWD MT_DQ [-D MACRO=VALUE ...]
variant() {
  local name=$1 mtf=$2 mtq=$3
  shift 3
  echo "== $name (MT_FWD $mtf, MT_DQ $mtq) $*"
  python3 bench/kernel_regs.py kernels/flash_attention.cu _d64 --cubin "$DEST/$name.cubin" "$@" | tail -n +2
  echo "$name=$DEST/$name.cubin:$mtf:$mtq" >> "$DEST/specs.txt"
}
variant base 1 2
variant fwd_mt2_b2 2 2 -D "$(d64 FA_MT_FWD 2)" -D "$(d64 FA_FWD_MIN_BLOCKS 2)"
variant dkdv_b2 1 2 -D "$(d64 FA_DKDV_MIN_BLOCKS 2)"
variant dkdv_smem_b3 1 2 -D FA_DKDV_KV_SMEM=1
variant dkdv_smem_b4 1 2 -D FA_DKDV_KV_SMEM=1 -D "$(d64 FA_DKDV_MIN_BLOCKS 4)"
variant dq_smem_b3 1 2 -D FA_DQ_QD_SMEM=1 -D "$(d64 FA_DQ_MIN_BLOCKS 3)"
variant dq_mt1_b3 1 1 -D "FA_MT_DQ(D)=1" -D "$(d64 FA_DQ_MIN_BLOCKS 3)"
variant dq_mt1_smem_b4 1 1 -D "FA_MT_DQ(D)=1" -D FA_DQ_QD_SMEM=1 -D "$(d64 FA_DQ_MIN_BLOCKS 4)"
