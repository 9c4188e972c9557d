#!/bin/sh
# tests/bench/llamacpp.sh — llama.cpp measured on this machine, in the same
# run and on the same files as llamad-bench, for docs/PERF.md comparisons.
#
#   sh tests/bench/llamacpp.sh [--tokenizer GGUF] [--text FILE] [--no-tokenize]
#                              [--depth N] [--decode-tokens N] [--model GGUF]...
#   sh tests/bench/llamacpp.sh --quantize IN.gguf OUT.gguf TYPE
#
# --quantize: llama.cpp's own quantizer (llama_model_quantize; TYPE one of
# q4_k_m, q5_k_m, q6_k, q4_k_s, q8_0, q4_0) makes OUT from IN, as
# llama-quantize IN OUT TYPE would: the mixes people download.
#
# Which llama.cpp: the prebuilt CPU build that the npm package
# node-llama-cpp 3.22.1 ships in @node-llama-cpp/linux-x64@3.22.1
# (libllama.v0.5.0.so, libggml*.so, one libggml-cpu-<variant>.so per x86 level;
# built by node-llama-cpp's CI on Ubuntu 22.04, no OpenMP, no GPU).
# node-llama-cpp records it as ggml-org/llama.cpp release tag "v0.5.0"
# (llama/llama.cpp.info.json; llama_version() says "0.5.0-dev"), and carries
# that release's source as a git bundle (llama/gitRelease.bundle: one
# squashed commit de3ff815ea7d559ee917f063901b8986f038abc6, dated
# 2026-09-28; plus patches/PR-22566.diff, a model-loader fix). Its llama.h
# and ggml headers, LICENSE and the Llama 3 vocabulary
# models/ggml-vocab-llama-bpe.gguf are taken from that bundle.
# Nothing here uses node or JavaScript: tests/bench/llamacpp_bench.c is a C
# program on llama.cpp's C API (llama_tokenize, llama_decode), so the figures
# are llama.cpp's own, as llama-bench would report them.
#
# Fetching (once, into $BUILD/llamacpp/; ~47 MB downloaded, ~36 MB kept):
# `npm pack` of the two pinned packages (no install scripts, no
# dependencies), each tarball checked against its pinned sha256. Without npm,
# git, a registry, or on anything but Linux x86-64 glibc it prints
# "llama.cpp not available: <why>" and exits 0, so `make bench` goes on.
#
# What is measured (best of $REPS, default 3; details in llamacpp_bench.c):
#  - tokenizer: llama_tokenize of the whole --text file (default: the
#    corpus of tests/bench/corpus.sh, made into $BUILD/bench-corpus.txt) with
#    --tokenizer's vocabulary (default: the Llama 3 one above), no BOS, no
#    special-token parsing, one thread; then llama_detokenize back. Same line
#    as llamad-bench --tokenize (encode_MB_s, decode_MB_s) plus impl=. For
#    Llama 3 llama.cpp's detokenizer applies clean_up_tokenization_spaces
#    (" ." -> "."), so round_trip=DIFFERS there is expected.
#  - each --model (default: $MODELS/stories260K.gguf): prefill of a 128-token
#    batch and decode of 128 single tokens at positions 0..127 of an empty
#    cache (llama-bench pp128 / tg128; --depth D --decode-tokens N: N
#    tokens after D, its -d D -n N), batch 1, $THREADS threads (default:
#    all cores) in a ggml threadpool. Same line as llamad-bench's model= line
#    (prefill_tok_s, decode_tok_s) plus impl= and cpu= (the ggml CPU variant).
#
# Env: BUILD (build), MODELS (../shared/models), THREADS (0 = all cores),
# REPS (3), PROMPT_TOKENS (128: the prefill, and the tokens whose state
# is saved as a llama-server slot file: slot_file_bytes), CC (cc). Exit status: 0, or the benchmark tool's on a real
# failure (a model llama.cpp cannot load, ...).
set -u
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
THREADS=${THREADS:-0}
REPS=${REPS:-3}
[ "$THREADS" -gt 0 ] 2>/dev/null || THREADS=$(nproc)

NLC_VERSION=3.22.1
NLC_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
BIN_SHA256=0d953e1503d5ab4608d8ed5b739132308c81ac05ffeb760d2a7f30e08a9f90e0
LLAMA_TAG=v0.5.0
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
LIBS="libllama.v0.5.0.so libggml.v0.5.0.so libggml-base.so"

here=$(cd "$(dirname "$0")" && pwd)
cache=$BUILD/llamacpp
stamp=$cache/.fetched-$NLC_VERSION

tokenizer='' text='' models='' do_tok=1 depth=0 ndec=128 qin='' qout='' qtype=''
while [ $# -gt 0 ]; do
    case $1 in
    --quantize) [ $# -ge 4 ] || { echo "llamacpp.sh: --quantize IN OUT TYPE" >&2; exit 2; }
                qin=$2; qout=$3; qtype=$4; shift 4 ;;
    --depth) depth=$2; shift 2 ;;
    --decode-tokens) ndec=$2; shift 2 ;;
    --tokenizer) tokenizer=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --model) models="$models $2"; shift 2 ;;
    --no-tokenize) do_tok=0; shift ;;
    *) echo "usage: llamacpp.sh [--tokenizer GGUF] [--text FILE] [--no-tokenize] [--depth N]" \
            "[--decode-tokens N] [--model GGUF]... | --quantize IN OUT TYPE" >&2
       exit 2 ;;
    esac
done

unavailable() { echo "llama.cpp not available: $*"; exit 0; }

fetch() {
    case $(uname -s)-$(uname -m) in
    Linux-x86_64) ;;
    *) unavailable "no prebuilt of node-llama-cpp $NLC_VERSION for $(uname -s) $(uname -m) is used here" ;;
    esac
    getconf GNU_LIBC_VERSION >/dev/null 2>&1 || unavailable "the prebuilt libraries need glibc"
    command -v npm >/dev/null 2>&1 || unavailable "npm is not installed (apt-get install npm)"
    command -v git >/dev/null 2>&1 || unavailable "git is needed to read the llama.cpp bundle"
    dl=$cache/download
    rm -rf "$cache"
    mkdir -p "$dl" || unavailable "cannot create $dl"
    for p in node-llama-cpp@$NLC_VERSION @node-llama-cpp/linux-x64@$NLC_VERSION; do
        echo "== llama.cpp: fetching $p from the npm registry"
        if ! (cd "$dl" && npm pack --loglevel=error --fetch-retries=1 --fetch-timeout=60000 \
                --fetch-retry-maxtimeout=10000 "$p") >"$dl/npm.log" 2>&1; then
            why=$(sed -n 's/^npm error code //p; s/^npm error .*reason: //p' "$dl/npm.log" |
                head -2 | tr '\n' ' ' | cut -c1-160)
            rm -rf "$cache"
            unavailable "npm could not fetch $p (${why:+$why- }registry unreachable?)"
        fi
    done
    check() {  # file sha256
        [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ] ||
            { rm -rf "$cache"; unavailable "$(basename "$1") is not the pinned tarball (sha256 differs)"; }
    }
    check "$dl/node-llama-cpp-$NLC_VERSION.tgz" "$NLC_SHA256"
    check "$dl/node-llama-cpp-linux-x64-$NLC_VERSION.tgz" "$BIN_SHA256"
    tar -xzf "$dl/node-llama-cpp-linux-x64-$NLC_VERSION.tgz" -C "$dl" package/bins/linux-x64 &&
        mv "$dl/package/bins/linux-x64" "$cache/lib" &&
        tar -xzf "$dl/node-llama-cpp-$NLC_VERSION.tgz" -C "$dl" package/llama/gitRelease.bundle \
            package/llama/llama.cpp.info.json ||
        { rm -rf "$cache"; unavailable "the npm tarballs did not unpack"; }
    grep -q "\"$LLAMA_TAG\"" "$dl/package/llama/llama.cpp.info.json" ||
        { rm -rf "$cache"; unavailable "node-llama-cpp $NLC_VERSION does not name llama.cpp $LLAMA_TAG"; }
    bundle=$(cd "$dl/package/llama" && pwd)/gitRelease.bundle
    git init -q --bare "$dl/src.git" &&
        git -C "$dl/src.git" fetch -q "$bundle" HEAD 2>"$dl/git.log" ||
        { rm -rf "$cache"; unavailable "git could not read the llama.cpp bundle"; }
    [ "$(git -C "$dl/src.git" rev-parse FETCH_HEAD)" = "$LLAMA_COMMIT" ] ||
        { rm -rf "$cache"; unavailable "the llama.cpp bundle is not commit $LLAMA_COMMIT"; }
    mkdir -p "$cache/src"
    git -C "$dl/src.git" archive "$LLAMA_COMMIT" LICENSE include ggml/include \
        models/ggml-vocab-llama-bpe.gguf | tar -x -C "$cache/src" ||
        { rm -rf "$cache"; unavailable "git archive of the llama.cpp bundle failed"; }
    rm -rf "$dl"
    echo "node-llama-cpp $NLC_VERSION, llama.cpp $LLAMA_TAG ($LLAMA_COMMIT)" > "$stamp"
}

[ -f "$stamp" ] || fetch
for l in $LIBS; do
    [ -f "$cache/lib/$l" ] || { rm -f "$stamp"; unavailable "$cache/lib/$l is missing (rerun to refetch)"; }
done

bin=$cache/llamacpp-bench
src=$here/llamacpp_bench.c
if [ ! -x "$bin" ] || [ -n "$(find "$src" -newer "$bin")" ]; then
    lib=$(cd "$cache/lib" && pwd)
    links=
    for l in $LIBS; do links="$links -l:$l"; done
    # shellcheck disable=SC2086
    if ! ${CC:-cc} -std=c11 -O2 -Wall -Wextra -D_GNU_SOURCE -I"$cache/src/include" \
            -I"$cache/src/ggml/include" "$src" -o "$bin" -L"$lib" $links \
            -Wl,-rpath,"$lib" 2>"$cache/build.log"; then
        cat "$cache/build.log" >&2
        echo "llama.cpp: building llamacpp-bench failed"
        exit 1
    fi
fi

rc=0
"$bin" --libdir "$cache/lib" --help >/dev/null 2>&1 ||
    unavailable "the prebuilt libraries do not load on this machine: $("$bin" --libdir "$cache/lib" --help 2>&1 | head -1)"
if [ -n "$qin" ]; then
    exec "$bin" --libdir "$cache/lib" --threads "$THREADS" --quantize "$qin" "$qout" "$qtype"
fi
if [ "$do_tok" = 1 ]; then
    if [ -z "$text" ]; then
        text=$BUILD/bench-corpus.txt
        sh "$here/corpus.sh" "$text"
    fi
    "$bin" --libdir "$cache/lib" --tokenizer "${tokenizer:-$cache/src/models/ggml-vocab-llama-bpe.gguf}" \
        --text "$text" --reps "$REPS" || rc=$?
fi
for m in ${models:-$MODELS/stories260K.gguf}; do
    "$bin" --libdir "$cache/lib" --model "$m" --threads "$THREADS" --reps "$REPS" \
        --prompt-tokens "${PROMPT_TOKENS:-128}" --decode-tokens "$ndec" --depth "$depth" || rc=$?
done
exit $rc
