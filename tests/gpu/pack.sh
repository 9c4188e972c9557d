#!/bin/sh
# tests/gpu/pack.sh [PACK] — bundle what tests/gpu/run.sh needs on a GPU
# machine that has the NVIDIA driver, CUDA and Python but none of the Debian
# packages: the shared libraries the binaries link (except glibc's and the
# C++ runtime), the binaries (bin/), the stories260K model files, the Llama 3
# tokenizer (llama3-tiny is generated there by llamad-genmodel) and the
# golden reference. run.sh with BUILD=PACK/bin then needs nothing else.
# PACK defaults to gpu-pack/ (ignored by git). Env: BUILD, MODELS, SHARED.
set -eu
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
SHARED=${SHARED:-../shared}
PACK=${1:-gpu-pack}
rm -rf "$PACK"
mkdir -p "$PACK/libs" "$PACK/models" "$PACK/reference" "$PACK/bin"
BINS="$BUILD/llamad $BUILD/llamactl $BUILD/llamad-gpucheck $BUILD/llamad-genmodel $BUILD/llamad-quantize"
for b in $BINS; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
    case $(basename "$lib") in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
        *) cp -L "$lib" "$PACK/libs/" ;;
    esac
done
# shellcheck disable=SC2086
cp $BINS "$PACK/bin/"
cp "$MODELS/stories260K.bin" "$MODELS/tok512.model" "$PACK/models/"
cp -r "$MODELS/stories260K-hf" "$MODELS/llama3-tokenizer" "$PACK/models/"
cp "$SHARED/reference/stories260K_greedy.txt" "$PACK/reference/"
du -sh "$PACK"
