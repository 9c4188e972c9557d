#!/bin/sh
# tests/golden/llama3.sh — llamad's one-shot greedy text on a Llama 3 model
# against an independent numpy forward pass (tests/tools/llama3_ref.py,
# float64, its own safetensors reader, HF's llama3 RoPE scaling and
# rotate_half layout).
#
# A random-weight llama3-tiny (tied embeddings, rope_theta 500000, llama3
# RoPE scaling, the real Llama 3 tokenizer) from llamad-genmodel, and its f32
# GGUF from llamad-quantize. For each prompt, numpy encodes the text by
# whole-word lookup (refusing text it cannot encode that way), greedy-decodes
# 16 tokens and detokenizes them as llamad's streaming detokenizer does;
# llamad --prompt (BOS + the prompt, --temperature 0) must print the same
# bytes from the HF folder and from the GGUF. This checks the whole path
# (tokenizer, forward pass, tied classifier, detokenizer), but at prompts
# this short the greedy text of this model does not depend on the RoPE
# scaling (numpy with --no-scaling gives the same ids): test_llama3.c
# compares the logits themselves, at positions past 8192, where it does.
# Env: BUILD, MODELS, SHARED, PYTHON (/usr/bin/python3, with numpy),
# LLAMAD_FLAGS (extra llamad flags).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
PYTHON=${PYTHON:-/usr/bin/python3}
. tests/tools/daemon.sh
need_files "$BUILD/llamad" "$BUILD/llamad-genmodel" "$BUILD/llamad-quantize" \
    "$MODELS/llama3-tokenizer/tokenizer.json" tests/tools/llama3_ref.py
"$PYTHON" -c 'import numpy' 2>/dev/null || { echo "FAIL: $PYTHON has no numpy (make deps)"; exit 1; }
test_frame

"$BUILD/llamad-genmodel" --shape llama3-tiny --out "$dir/hf" \
    --tokenizer "$MODELS/llama3-tokenizer/tokenizer.json" >"$dir/log" 2>&1 &&
    "$BUILD/llamad-quantize" --model "$dir/hf" --type f32 --out "$dir/tiny.gguf" >>"$dir/log" 2>&1 ||
    { cat "$dir/log"; echo "FAIL: could not make the model"; exit 1; }

check() {  # name prompt
    "$PYTHON" tests/tools/llama3_ref.py --model "$dir/hf" --text "$2" --bos --n 16 \
        >"$dir/ref.json" 2>"$dir/err" || { bad "$1: numpy reference: $(cat "$dir/err")"; return; }
    # the expected bytes: the JSON text field, and llamad's closing newline
    "$PYTHON" -c 'import json, sys; sys.stdout.write(json.load(open(sys.argv[1]))["text"] + "\n")' \
        "$dir/ref.json" >"$dir/want"
    n=$("$PYTHON" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["generated"]))' \
        "$dir/ref.json")
    for m in hf tiny.gguf; do
        # shellcheck disable=SC2086
        "$BUILD/llamad" --model "$dir/$m" $LLAMAD_FLAGS --prompt "$2" --temperature 0 \
            --max-tokens 16 >"$dir/got" 2>"$dir/err" || { bad "$1 $m: llamad: $(cat "$dir/err")"; continue; }
        if cmp -s "$dir/want" "$dir/got"; then
            ok "$1 $m: $n greedy tokens = numpy's ($(wc -c <"$dir/got") bytes)"
        else
            bad "$1 $m: llamad's text differs from numpy's"
            echo "numpy:  $(od -c "$dir/want" | head -5)"
            echo "llamad: $(od -c "$dir/got" | head -5)"
        fi
    done
}

check "story" "Once upon a time"
check "words" "The quick brown fox jumps over the lazy dog, and 42 cats watched it happen."
exit $fail
