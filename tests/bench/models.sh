# tests/bench/models.sh — a model the benchmark scripts share (sourced by
# run.sh, prefix.sh, http_turns.sh). Needs BUILD, MODELS, OUT.
#
# bench_110m_ctx4k: sets $ctx4k to the stories110M shape (random weights,
# f16) read with a 4,096-token context: $OUT/stories110M-f16 (made when
# missing) seen through $OUT/stories110M-f16-ctx4k, whose config.json says
# 4,096 positions and whose weights and tokenizer are links to it.
bench_110m_ctx4k() {
    if [ ! -f "$OUT/stories110M-f16/config.json" ]; then
        "$BUILD/llamad-genmodel" --shape stories110M --dtype f16 --out "$OUT/stories110M-f16" \
            --tokenizer "$MODELS/tokenizer.model" >/dev/null
    fi
    ctx4k=$OUT/stories110M-f16-ctx4k
    if [ ! -f "$ctx4k/config.json" ]; then
        mkdir -p "$ctx4k"
        ln -sf ../stories110M-f16/model.safetensors "$ctx4k/model.safetensors"
        ln -sf ../stories110M-f16/tokenizer.model "$ctx4k/tokenizer.model"
        sed 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 4096/' \
            "$OUT/stories110M-f16/config.json" > "$ctx4k/config.json"
    fi
}
