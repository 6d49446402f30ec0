#!/bin/sh
# Build antirez/ds4 (CPU backend) as the reference ds4tui is checked against, outside the repo.
#
#   bench/ds4_reference.sh DS4_SOURCE_DIR N [OUT_DIR]
#
# ds4 runs exactly one shape, DeepSeek V4 Flash, fixed at compile time by an enum in ds4.c
# (DS4_N_LAYER = 43, the widths beside it). To run an N-layer slice of that shape (the true-shape
# slice GGUF, docs/dsv4-gguf.md), this copies the source to OUT_DIR/src, sets DS4_N_LAYER to N
# there (nothing else changes: every width, type and metadata check stays ds4's), runs ds4's own
# `make cpu` (ds4, ds4-server, ds4-agent, ds4-bench, ds4-eval: CPU only), then links against the
# objects that build made bench/ds4ref.c (a driver over ds4's public API: logits, greedy tokens,
# sessions saved and restored through ds4's disk store) and bench/ds4render.c (ds4-server's chat
# prompt renderer, for the DeepSeek V4 template's tests). OUT_DIR defaults to /tmp/ds4-ref/nN.
# Prints OUT_DIR; point the tests at it with DS4TUI_DS4_DIR=OUT_DIR
# (tests/engine/dsv4/test_ds4_reference.py, which skips with the reason when it is absent).
#
# The source: the fetch of github:antirez/ds4 (`git archive HEAD | tar -x -C /tmp/ds4`);
# built on 2026-12-04 from 8d57664 ("Handle prefill errors after SSE keepalive").
# Compiler flags are ds4's (-O3 -ffast-math -march=native); takes a few minutes on 2 cores
# (MAKEFLAGS=-j2 and nice apply as usual).
set -eu
src=${1:?usage: $0 DS4_SOURCE_DIR N [OUT_DIR]}
n=${2:?usage: $0 DS4_SOURCE_DIR N [OUT_DIR]}
out=${3:-/tmp/ds4-ref/n$n}
here=$(cd "$(dirname "$0")/.." && pwd)
case $n in ''|*[!0-9]*) echo "N must be a layer count, got '$n'" >&2; exit 2;; esac
[ -f "$src/ds4.c" ] || { echo "$src has no ds4.c" >&2; exit 2; }
mkdir -p "$out/src"
# Copy only what the build reads (the repo also holds datasets and GPU sources).
cp "$src"/Makefile "$src"/*.c "$src"/*.h "$out/src/"
[ -f "$src/ds4_iq2_tables_cuda.inc" ] && cp "$src/ds4_iq2_tables_cuda.inc" "$out/src/"
sed -i "s/^\( *DS4_N_LAYER *= *\)[0-9][0-9]*,/\1$n,/" "$out/src/ds4.c"
grep -q "^ *DS4_N_LAYER *= *$n," "$out/src/ds4.c" || { echo "ds4.c: DS4_N_LAYER enum not found" >&2; exit 1; }
(cd "$out/src" && nice -n 15 make cpu >"$out/build.log" 2>&1) || { tail -20 "$out/build.log" >&2; exit 1; }
cc -O2 -Wall -I"$out/src" "$here/bench/ds4ref.c" "$out/src/ds4_cpu.o" "$out/src/ds4_kvstore.o" \
   -lm -pthread -o "$out/ds4ref"
# ds4-server's request parser and prompt renderer, no model (bench/ds4render.c)
cc -O1 -w -std=c99 -D_GNU_SOURCE -DDS4_NO_GPU -I"$out/src" "$here/bench/ds4render.c" \
   "$out/src/ds4_cpu.o" "$out/src/ds4_kvstore.o" "$out/src/rax.o" -lm -pthread -o "$out/ds4render"
for b in ds4 ds4-server ds4-agent; do ln -sf "src/$b" "$out/$b"; done
echo "$n" >"$out/n_layers"
echo "$out"
