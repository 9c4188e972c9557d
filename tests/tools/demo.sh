#!/bin/sh
# make demo: the main job on the small default model (stories260K).
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
echo "llamad one-shot: stories260K, prompt \"Once upon a time\", 200 tokens, temperature 0.8, seed 42" >&2
exec "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --prompt "Once upon a time" --echo --max-tokens 200 --temperature 0.8 --seed 42 --verbose
