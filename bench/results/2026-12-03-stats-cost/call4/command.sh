# Call 4 of the seventeenth pass: Nsight Compute on SwiGLU's backward paired cast (cast_src5) at the
# amax level (no statistics) and at the cheap level (statistics every step), llama-1b FP8 delayed,
# one launch in the third step: speed of light, occupancy, warp stalls, instruction mix, and the
# pipes' utilization (which pipe the statistics' f64 work loads).
set -u
O=$OUT
cd gpu-bundle
export FP8SCOPE_GEMM_CACHE=$O/gemm-algorithms.json
M=sm__inst_executed_pipe_fp64.avg.pct_of_peak_sustained_active,sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
for extra in "--stats-every 0" ""; do
  tag=$([ -n "$extra" ] && echo amax || echo cheap)
  timeout 280 ncu --clock-control none -k 'regex:^cast_src5_l[01]_f[12]$' --launch-skip 40 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
    --metrics $M bin/fp8-capture train --quiet --device cuda --preset llama-1b --recipe delayed --steps 4 $extra --out /tmp/ncu-$tag \
    > $O/ncu-$tag.txt 2>&1
  echo "== $tag: exit $?"
  grep -E "cast_src5|Duration|Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|pipe|inst_executed.sum|issue_active|warps_active|Stall" $O/ncu-$tag.txt | head -40
done
