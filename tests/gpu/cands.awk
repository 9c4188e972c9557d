# tests/gpu/cands.awk — the layer candidates' table of a GPU run: reads
# gpucheck's cands.log ("cands: CAND DTYPE ok|FAIL") and bench.log
# ("decode1 cand=C dtype=D tok_s=T ... pct_roof=P", "decode8 cand=C dtype=D
# tok_s=T"); prints decode tok/s (% of the roof) per candidate x dtype and the
# winners: per dtype the fastest batch-1 candidate that passed its check and
# raised no device error, as an LLAMAD_CUDA_KERNELS spec, also written to the
# file WIN. Used by tests/gpu/run.sh; tests/integration/gpu_table.sh checks it.
/^cands: / { ok[$2 " " $3] = $4 }
/^decode1 cand=/ || /^decode8 cand=/ {
    n = split($0, f, " "); c = ""; d = ""; t = ""; p = ""
    for (i = 2; i <= n; i++) {
        split(f[i], kv, "=")
        if (kv[1] == "cand") c = kv[2]; else if (kv[1] == "dtype") d = kv[2]
        else if (kv[1] == "tok_s") t = kv[2]; else if (kv[1] == "pct_roof") p = kv[2]
    }
    if ($1 == "decode1") { d1[c " " d] = t; pr[c " " d] = p; if (/DEVICE-ERROR/) bad[c " " d] = 1 }
    else d8[c " " d] = t
    cands[c] = 1; dts[d] = 1
}
END {
    nc = split("base fused persistent splitk", cs, " ")
    nd = split("f16 q8_0 q4_0 q4_k", ds, " ")
    printf "  %-11s", "tok/s (%roof)"
    for (j = 1; j <= nd; j++) printf " %-22s", ds[j] " b1 | b8"
    printf "\n"
    for (i = 1; i <= nc; i++) {
        printf "  %-11s", cs[i]
        for (j = 1; j <= nd; j++) {
            k = cs[i] " " ds[j]; mark = (ok[k] == "ok" && !bad[k]) ? "" : "x"
            if (d1[k] == "") printf " %-22s", "-"
            else printf " %-22s", sprintf("%s%.0f (%.0f%%) | %s", mark, d1[k], pr[k],
                                          d8[k] == "" ? "-" : sprintf("%.0f", d8[k]))
        }
        printf "\n"
    }
    spec = ""
    for (j = 1; j <= nd; j++) {
        best = ""; bt = 0
        for (i = 1; i <= nc; i++) {
            k = cs[i] " " ds[j]
            if (ok[k] == "ok" && !bad[k] && d1[k] + 0 > bt) { bt = d1[k] + 0; best = cs[i] }
        }
        if (best != "") spec = spec (spec == "" ? "" : ",") ds[j] "=" best
    }
    print "  (x: failed its check against the CPU; b1/b8: batch 1/8 decode)"
    print "  winners: " spec
    print spec > WIN
}