#!/bin/sh
# Build tests/reliability/ds4/harness.c against an unmodified antirez/ds4 checkout's
# ds4_kvstore.c, for tests/reliability/test_beside_ds4.py (which skips without it).
#   scripts/build_ds4_harness.sh /path/to/ds4 [/tmp/ds4-harness/harness]
# The binary goes under /tmp by default: nothing of ds4's is built into the repository.
set -eu
src=${1:?usage: $0 DS4_SOURCE_DIR [OUT]}
out=${2:-/tmp/ds4-harness/harness}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$(dirname "$out")"
cc -O1 -Wall -I"$src" "$here/tests/reliability/ds4/harness.c" "$src/ds4_kvstore.c" -lm -o "$out"
echo "$out"
