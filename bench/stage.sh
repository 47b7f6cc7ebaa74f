#!/usr/bin/env bash
# On a build machine with Rust: build the workspace in release, then copy fp8-capture, fp8-analyze, the CUDA test
# binaries and bench/ into DEST (default: gpu-bundle/ in the repository, git-ignored), a folder to
# copy to a GPU machine that has no Rust toolchain. With XZ=1 the binaries are stripped and
# xz-compressed (each embeds the kernels' CUBINs: about 45 MB stripped, 6 MB compressed); unpack
# them there with `xz -d DEST/bin/*.xz`.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-gpu-bundle}
# The target directory of `cargo run --release` and .ci/run (.ci/target-dir.sh holds the rule).
source .ci/target-dir.sh
cargo build --release --workspace --locked
mkdir -p "$DEST/bin"
cp "$TARGET_DIR/release/fp8-capture" "$TARGET_DIR/release/fp8-analyze" "$DEST/bin/"
for t in cuda_layers cuda_kernels cuda_graph cuda_ranks; do
  f=$(cargo test --release --workspace --locked --test $t --no-run --message-format=json 2>/dev/null | python3 -c "import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get('reason')=='compiler-artifact' and m.get('executable') and m['target']['name']=='$t': print(m['executable'])")
  [ -n "$f" ] || { echo "stage.sh: the test $t did not build (cargo test --release --workspace --test $t --no-run)" >&2; exit 1; }
  cp "$f" "$DEST/bin/$t"
done
if [ "${XZ:-0}" = 1 ]; then
  for f in "$DEST"/bin/*; do
    case "$f" in *.xz) continue ;; esac
    strip "$f" && rm -f "$f.xz" && xz -T0 -6 "$f"
  done
fi
rm -rf "$DEST/bench" && cp -r bench "$DEST/bench"
ls -la "$DEST/bin"
