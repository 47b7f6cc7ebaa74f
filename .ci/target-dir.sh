# Sourced (from the repository root) by .ci/run and bench/stage.sh: the one rule that picks the
# cargo target directory, so that `cargo run --release`, `bash .ci/run` and bench/stage.sh share one
# release build.
#   - CARGO_TARGET_DIR, when it is set;
#   - else, under CI (CI set to anything but empty, 0 or false): $HOME/.cache/fp8scope-target, which
#     CI keeps between runs on fresh clones (exported, so that every cargo command uses it);
#   - else nothing is exported: cargo uses its own default, the same as a plain `cargo run --release`
#     (the checkout's target/, or build.target-dir of a cargo configuration).
# Sets TARGET_DIR to the directory cargo will use, for messages and for copying binaries out of it.
case "${CI:-}" in
  "" | 0 | false) ;;
  *) export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fp8scope-target}" ;;
esac
TARGET_DIR=${CARGO_TARGET_DIR:-$(cargo metadata --no-deps --format-version 1 2>/dev/null |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null || true)}
TARGET_DIR=${TARGET_DIR:-$PWD/target}
