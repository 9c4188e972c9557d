#!/bin/sh
# tests/gpu/ptxas.sh [FILE.cu...] — registers, spills and shared memory of
# every kernel as ptxas compiles it for sm_90a (no GPU needed): one line per
# kernel instantiation, "regs spill_st spill_ld smem name", sorted by name.
# Default files: the matrix-vector and layer kernels (matmul.cu,
# candidates/fused.cu, candidates/layer.cu, attention.cu). docs/PERF.md
# keeps the figures.
cd "$(dirname "$0")/../.." || exit 1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ $# -gt 0 ] || set -- kernels/cuda/matmul.cu kernels/cuda/candidates/fused.cu \
                       kernels/cuda/candidates/layer.cu kernels/cuda/attention.cu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$@"; do
    "$NVCC" -I. -DLLAMAD_CUDA -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
        -Xptxas -v -c "$f" -o "$tmp/o.o" 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
    # "Compiling entry function 'NAME' for 'sm_90a'", then "Used N registers",
    # "N bytes stack frame, N bytes spill stores, N bytes spill loads",
    # "... N bytes smem"
    awk -v file="$(basename "$f")" '
        /Compiling entry function/ { n = $0; sub(/.*function .?/, "", n); sub(/.? for .*/, "", n); name = n }
        /bytes spill stores/ { for (i = 1; i <= NF; i++) { if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") st = $i; if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "loads") ld = $i } }
        /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) { if ($i == "Used") r = $(i+1); if ($(i+1) == "bytes" && $(i+2) == "smem") sm = $i }
                                  printf "%s %4d %5d %5d %6d %s\n", file, r, st, ld, sm, name; sm = 0 }
    ' "$tmp/log" | while read -r file r st ld sm name; do
        printf '%-13s %4s %5s %5s %6s %s\n' "$file" "$r" "$st" "$ld" "$sm" "$(echo "$name" | c++filt)"
    done
done | sort -k6
