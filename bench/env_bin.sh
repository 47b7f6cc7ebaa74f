#!/usr/bin/env bash
# A build directory that runs another one's binaries with environment variables set: for comparing
# two settings of one build side by side with the scripts that compare two builds (compare_builds.sh,
# speed and tables), e.g. the weights' casts in one launch against one a weight:
#   bench/env_bin.sh bin each FP8SCOPE_WEIGHT_CASTS=each && bench/compare_builds.sh each bin OUT
# Usage: bench/env_bin.sh SRC_BIN_DIR DEST_DIR NAME=VALUE...
# DEST_DIR gets, for each executable of SRC_BIN_DIR, a script of the same name that sets the
# variables and runs it (by absolute path, so DEST_DIR may move beside SRC_BIN_DIR only).
set -euo pipefail
SRC=${1:?source bin dir}; DEST=${2:?dest dir}; shift 2
[ $# -gt 0 ] || { echo "env_bin.sh: name at least one NAME=VALUE" >&2; exit 2; }
for kv in "$@"; do
  [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]] || { echo "env_bin.sh: '$kv' is not NAME=VALUE" >&2; exit 2; }
done
SRC=$(cd "$SRC" && pwd)
mkdir -p "$DEST"
n=0
for f in "$SRC"/*; do
  [ -f "$f" ] && [ -x "$f" ] || continue
  {
    echo '#!/usr/bin/env bash'
    printf 'export %q\n' "$@"
    printf 'exec %q "$@"\n' "$f"
  } > "$DEST/$(basename "$f")"
  chmod +x "$DEST/$(basename "$f")"
  n=$((n + 1))
done
[ $n -gt 0 ] || { echo "env_bin.sh: no executable in $SRC" >&2; exit 2; }
echo "env_bin.sh: $n wrapper(s) in $DEST running $SRC with $*"
