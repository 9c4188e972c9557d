#!/bin/sh
# tests/integration/gpu_table.sh — the table and winners of a GPU run
# (tests/gpu/cands.awk, as tests/gpu/run.sh calls it) from logs written
# here in gpucheck's formats: the fastest candidate per dtype wins only when
# it passed its check against the CPU and raised no device error; a failed
# or erroring candidate is marked in the table; a dtype whose every
# candidate failed has no winner; the winners file is an LLAMAD_CUDA_KERNELS
# spec. (No GPU needed: the logs stand in for one.)
. tests/tools/daemon.sh
test_frame
cat >"$dir/cands.log" <<'LOG'
ok   cand fused f16                                relerr 1.00e-05  tol 5e-03
cands: base f16 ok
cands: fused f16 ok
cands: persistent f16 FAIL
cands: splitk f16 ok
cands: base q8_0 ok
cands: fused q8_0 ok
cands: persistent q8_0 ok
cands: splitk q8_0 ok
cands: base q4_0 FAIL
cands: fused q4_0 FAIL
cands: persistent q4_0 FAIL
cands: splitk q4_0 FAIL
cands: base q4_k ok
cands: fused q4_k ok
cands: persistent q4_k ok
cands: splitk q4_k ok
LOG
cat >"$dir/bench.log" <<'LOG'
copy_bw_gb_s=4198 gemm_f16_tflops=682.5
decode1 cand=base dtype=f16 tok_s=188.2 step_ms=5.314 roof_tok_s=317.7 pct_roof=59.2
decode8 cand=base dtype=f16 tok_s=1400 step_ms=5.71
decode1 cand=fused dtype=f16 tok_s=220.0 step_ms=4.545 roof_tok_s=317.7 pct_roof=69.2
decode8 cand=fused dtype=f16 tok_s=1500 step_ms=5.33
decode1 cand=persistent dtype=f16 tok_s=290.0 step_ms=3.448 roof_tok_s=317.7 pct_roof=91.3
decode8 cand=persistent dtype=f16 tok_s=1500 step_ms=5.33
decode1 cand=splitk dtype=f16 tok_s=219.0 step_ms=4.566 roof_tok_s=317.7 pct_roof=68.9
decode8 cand=splitk dtype=f16 tok_s=1490 step_ms=5.37
decode1 cand=base dtype=q8_0 tok_s=254.9 step_ms=3.923 roof_tok_s=598.0 pct_roof=42.6
decode8 cand=base dtype=q8_0 tok_s=1900 step_ms=4.21
decode1 cand=fused dtype=q8_0 tok_s=300.0 step_ms=3.333 roof_tok_s=598.0 pct_roof=50.2
decode8 cand=fused dtype=q8_0 tok_s=2000 step_ms=4.00
decode1 cand=persistent dtype=q8_0 tok_s=500.0 step_ms=2.000 roof_tok_s=598.0 pct_roof=83.6 DEVICE-ERROR
decode8 cand=persistent dtype=q8_0 tok_s=2000 step_ms=4.00 DEVICE-ERROR
decode1 cand=splitk dtype=q8_0 tok_s=420.0 step_ms=2.381 roof_tok_s=598.0 pct_roof=70.2
decode8 cand=splitk dtype=q8_0 tok_s=2100 step_ms=3.81
decode1 cand=base dtype=q4_0 tok_s=309.8 step_ms=3.228 roof_tok_s=1129.6 pct_roof=27.4
decode1 cand=base dtype=q4_k tok_s=200.0 step_ms=5.000 roof_tok_s=900.0 pct_roof=22.2
decode1 cand=fused dtype=q4_k tok_s=199.0 step_ms=5.025 roof_tok_s=900.0 pct_roof=22.1
LOG
out=$(awk -f tests/gpu/cands.awk WIN="$dir/winners.txt" "$dir/cands.log" "$dir/bench.log")
echo "$out"
win=$(cat "$dir/winners.txt")
[ "$win" = "f16=fused,q8_0=splitk,q4_k=base" ] && ok "winners: $win" \
    || bad "winners: '$win', want f16=fused,q8_0=splitk,q4_k=base (persistent f16 failed its check, persistent q8_0 hit a device error, every q4_0 failed)"
echo "$out" | grep -q "winners: f16=fused,q8_0=splitk,q4_k=base" && ok "the table names the winners" \
    || bad "the table does not name the winners"
echo "$out" | grep -E "^  persistent" | grep -q "x290 (91%) | 1500" && ok "a failed candidate is marked" \
    || bad "persistent f16 not marked as failed"
echo "$out" | grep -E "^  splitk" | grep -q "420 (70%) | 2100" && ok "tok/s, % of the roof, batch 8" \
    || bad "splitk q8_0's cell is wrong"
echo "$out" | grep -E "^  fused" | grep -q " - " && ok "a candidate not benched shows -" \
    || bad "no '-' for fused q4_0"
# the spec is one LLAMAD_CUDA_KERNELS takes: dtype=candidate pairs
echo "$win" | grep -Eq '^([a-z0-9_]+=(base|fused|persistent|splitk),?)+$' && ok "winners is a spec" \
    || bad "winners is not a spec: $win"
exit $fail
