set -e
cd /work/main
D=gpu-bundle/fv2; rm -rf $D; mkdir -p $D
d64() { echo "$1(D)=((D) <= 64 ? $2 : 1)"; }
k() { n=$1; src=$2; shift 2; echo "== $n $*"; python3 bench/kernel_regs.py $src _d64 --cubin $D/$n.cubin "$@" | grep d64; }
cp /tmp/fa0.cubin $D/old.cubin
k base kernels/flash_attention.cu
k order_only kernels/.order_only.cu
k base_fwd_mt1 kernels/flash_attention.cu -D "FA_MT_FWD(D)=1" -D "$(d64 FA_FWD_MIN_BLOCKS 4)"
k dq_mt1_b3 kernels/flash_attention.cu -D "FA_MT_DQ(D)=1" -D "$(d64 FA_DQ_MIN_BLOCKS 3)"
k dkdv_smem_b4 kernels/flash_attention.cu -D FA_DKDV_KV_SMEM=1 -D "$(d64 FA_DKDV_MIN_BLOCKS 4)"
k dkdv_b2 kernels/flash_attention.cu -D "$(d64 FA_DKDV_MIN_BLOCKS 2)"
cat > $D/all.txt <<EOT
old=$D/old.cubin:1:2:tiles-x
base=$D/base.cubin:2:2
order_only=$D/order_only.cubin:2:2
base_fwd_mt1=$D/base_fwd_mt1.cubin:1:2
dq_mt1_b3=$D/dq_mt1_b3.cubin:2:1
dkdv_smem_b4=$D/dkdv_smem_b4.cubin:2:2
dkdv_b2=$D/dkdv_b2.cubin:2:2
EOT
