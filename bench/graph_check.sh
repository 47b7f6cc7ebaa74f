#!/usr/bin/env bash
# Whether the step in CUDA graphs records every run the launched step does, bit for bit, over the
# recording paths and recipes a user may combine: each case trains twice with one binary, with
# FP8SCOPE_GRAPH=0 and =1, and every table (steps, stats, shadow, tensors, events; wall-clock
# columns aside) is compared by `runs.py tables`. Each graphed run's own count of the steps it
# graphed is printed (FP8SCOPE_VERBOSE=1), and a case whose graphs fell back to launch by launch
# fails. The cases: `small` (GPT-2 style) and `llama-small`, BF16, delayed and current scaling
# (block scaling runs on the CPU only), E4M3 everywhere, every accumulation mode, GEMM kinds /
# layers / sites sent back to BF16, the BF16 shadow GEMMs, dumps of every layer, planted faults,
# a built-in scenario, and statistics off. About 100 s on an H100 whose kernels are compiled.
# Usage: bench/graph_check.sh BIN_DIR OUT_DIR [STEPS (12)]
# DEVICE (cuda) picks the backend: DEVICE=cpu checks the script itself (graphs are the GPU's).
set -uo pipefail
BIN=${1:?bin dir}; OUT=${2:?out dir}; STEPS=${3:-12}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$BIN/fp8-capture" ] || { echo "graph_check.sh: no fp8-capture in $BIN" >&2; exit 2; }
mkdir -p "$OUT"
cases=(
  "small-bf16|--preset small --recipe bf16"
  "small-delayed-dumps-shadow|--preset small --recipe delayed --dump-every 5 --dump-layers . --shadow"
  "small-current-fast|--preset small --recipe current --accumulation fast --channel-stats-every 3"
  "small-delayed-e4m3-split|--preset small --recipe delayed --format e4m3 --accumulation split --quant-error-every 4"
  "small-delayed-bf16-gemms|--preset small --recipe delayed --bf16-gemms dgrad --bf16-layers 1"
  "small-delayed-inject|--preset small --recipe delayed --inject site=layers.1.fc2,gemm=dgrad,kind=outlier,step=6,magnitude=1000"
  "llama-small-bf16|--preset llama-small --recipe bf16"
  "llama-small-delayed-dumps-shadow|--preset llama-small --recipe delayed --dump-every 4 --dump-layers . --shadow"
  "llama-small-current|--preset llama-small --recipe current --quant-error-every 3"
  "llama-small-delayed-sites|--preset llama-small --recipe delayed --bf16-sites layers.0.fc2:wgrad"
  "llama-small-delayed-nostats|--preset llama-small --recipe delayed --stats-every 0"
  "llama-small-spike|--preset llama-small --scenario spike --scenario-step 6"
  "llama-small-inject-overflow|--preset llama-small --recipe delayed --inject site=layers.0.fc1,gemm=fprop,kind=overflow,step=5"
)
status=0
for c in "${cases[@]}"; do
  name=${c%%|*}
  read -r -a flags <<< "${c#*|}"
  line="$name:"
  for g in 0 1; do
    run="$OUT/$name-g$g"
    FP8SCOPE_GRAPH=$g FP8SCOPE_VERBOSE=1 timeout 120 "$BIN/fp8-capture" train --quiet --device "${DEVICE:-cuda}" --steps "$STEPS" \
      "${flags[@]}" --out "$run" > "$run.log" 2>&1
    rc=$?
    # 3 is a diverged run (a planted fault may end it): its tables are compared all the same.
    if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
      line="$line graphs=$g failed (rc $rc: $(tail -1 "$run.log"))"; status=1
    fi
  done
  counts=$(grep -E "CUDA graphs" "$OUT/$name-g1.log" | tail -1)
  if grep -q "the run goes on launch by launch" "$OUT/$name-g1.log"; then
    line="$line FELL BACK ($(grep "the run goes on launch by launch" "$OUT/$name-g1.log" | head -1))"; status=1
  fi
  # A case none of whose steps was graphed checks nothing.
  if [[ "$counts" == *"CUDA graphs: 0 steps graphed"* ]]; then
    line="$line NONE GRAPHED"; [ "${DEVICE:-cuda}" = cpu ] || status=1
  fi
  tables=$(python3 "$HERE/runs.py" tables "$OUT/$name-g0" "$OUT/$name-g1" 2>&1) || status=1
  echo "$line ${counts:-no graph counts} | $(echo "$tables" | cut -c1-400)"
done
echo "== graph_check status $status"
exit $status
