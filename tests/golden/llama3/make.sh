#!/bin/sh
# tests/golden/llama3/make.sh — regenerate tokenize.json and chat.json from
# independent JavaScript implementations (see make_goldens.mjs).
#
#   tests/golden/llama3/make.sh [SCRATCH_DIR]
#
# Needs node (>= 18) and the npm registry. The packages go into SCRATCH_DIR
# (default /tmp/llamad-js-gold), outside the repository:
#
#   npm install --save-exact @huggingface/tokenizers@0.2.0 \
#       @lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.11
#
# The tokenizer is $MODELS/llama3-tokenizer (default ../shared/models).
# Not run by the test suite; the outputs are committed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
scratch=${1:-/tmp/llamad-js-gold}
models=${MODELS:-$here/../../../../shared/models}
mkdir -p "$scratch"
cd "$scratch"
[ -f package.json ] || echo '{"name": "llamad-js-gold", "private": true}' >package.json
npm install --save-exact --no-audit --no-fund \
	@huggingface/tokenizers@0.2.0 @lenml/tokenizers@3.7.2 @huggingface/jinja@0.5.11
cp "$here/make_goldens.mjs" "$scratch/"
node "$scratch/make_goldens.mjs" "$models/llama3-tokenizer" "$here"
