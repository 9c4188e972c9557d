#!/bin/sh
# tests/bench/prefix.sh: prefix sharing, measured through the socket. On the
# stories110M shape (f16 weights, f16 K/V, 4,096-token context): 32 chat
# sessions with one ~1,000-token system prompt, each with its own question
# and a 16-token greedy answer (llamad-bench-daemon prefix): K/V held, time
# to first token of a new session with that prompt against another prompt,
# a Save of all; the state directory's bytes (state files and blocks/);
# then the daemon stopped (SIGTERM), started again and every session
# restored (llamad-bench-daemon prefix-restore: a Fork of each). Once with
# prefix_sharing on, once off (PREFIX_SHARING="on off"). Prints key=value
# lines (bench=prefix*) and a table; called by run.sh (make bench).
# Env: BUILD, MODELS, THREADS (0: all cores), PREFIX_SESSIONS (32),
# PREFIX_SHARING ("on off").
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
THREADS=${THREADS:-0}
N=${PREFIX_SESSIONS:-32}
MODES=${PREFIX_SHARING:-"on off"}
D=$BUILD/llamad-bench-daemon
OUT=$BUILD/bench-models
sock=$BUILD/bench-prefix.sock
log=$BUILD/bench-prefix.log
: > "$log"

# the model: the 110M shape (1,024-token context) read with 4,096 (as run.sh)
. tests/bench/models.sh
bench_110m_ctx4k
model=$ctx4k

ms() { date +%s%N | awk '{ printf "%.1f", $1 / 1e6 }'; }
dpid=
trap '[ -z "$dpid" ] || kill "$dpid" 2>/dev/null || true' EXIT
start() {  # sharing state-dir: starts llamad, does not wait for it
    rm -f "$sock"
    "$BUILD/llamad" --model "$model" --kv-type f16 --kv-memory 4G --prefix-sharing "$1" \
        --state-dir "$2" --save-delay 86400 --socket "$sock" --threads "$THREADS" \
        --log-level warning &
    dpid=$!
}
wait_sock() {
    i=0
    while [ ! -S "$sock" ]; do i=$((i + 1)); [ $i -gt 600 ] && exit 1; sleep 0.1; done
}
stop() {  # prints the milliseconds SIGTERM took to end it
    t0=$(ms)
    kill "$dpid"
    wait "$dpid" || true
    dpid=
    echo "$t0 $(ms)" | awk '{ printf "%.1f", $2 - $1 }'
}
bytes_of() {  # files...: count and apparent bytes
    for f in "$@"; do [ -f "$f" ] && stat -c %s "$f"; done |
        awk '{ n++; b += $1 } END { printf "%d %d", n, b }'
}

echo "== daemon: stories110M shape f16, $N sessions with one 1,000-token system prompt ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
for mode in $MODES; do
    state=$BUILD/bench-prefix-state-$mode
    rm -rf "$state"
    start "$mode" "$state"
    wait_sock
    "$D" "$sock" prefix --sessions "$N" --history 1000 --tokens 16 | tee -a "$log"
    st=$(bytes_of "$state"/*.session)
    bl=$(bytes_of "$state"/blocks/*.kvb)
    sf=${st% *} sb=${st#* } bf=${bl% *} bb=${bl#* }
    echo "bench=prefix_disk sharing=$mode state_files=$sf state_bytes=$sb block_files=$bf" \
        "block_bytes=$bb total_bytes=$((sb + bb)) du_kib=$(du -sk "$state" | cut -f1)" | tee -a "$log"
    stop_ms=$(stop)
    start "$mode" "$state"
    "$D" "$sock" prefix-restore --sessions "$N" | sed "s/\$/ stop_ms=$stop_ms/" | tee -a "$log"
    stop >/dev/null
    left=$(find "$state/blocks" -type f 2>/dev/null | wc -l)
    [ "$left" = 0 ] || echo "prefix: $left block files left after every session was dropped" | tee -a "$log"
    rm -rf "$state"
done

# the table: one column per mode
awk -v modes="$MODES" '
/^bench=prefix/ {
    tag = ""; b = ""
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "sharing") tag = kv[2]
        if (kv[1] == "bench") b = kv[2]
    }
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[tag, b "." kv[1]] = kv[2] }
}
function row(name, key, goal) {
    printf "%-42s", name
    for (k = 1; k <= nm; k++) printf " %12s", (m[k], key) in v ? v[m[k], key] : "-"
    printf "  %s\n", goal
}
END {
    nm = split(modes, m, " ")
    printf "%-42s", "prefix_sharing"; for (k = 1; k <= nm; k++) printf " %12s", m[k]
    printf "  goal (sharing on)\n"
    row("system prompt, tokens", "prefix.system_tokens", "")
    row("prompt tokens shared, sessions 2..N", "prefix.later_shared_tokens", "")
    row("first token, sessions 2..N (median), ms", "prefix.later_ttft_median_ms", "")
    row("K/V held (distinct blocks), bytes", "prefix_kv.held_bytes", "")
    row("  blocks held", "prefix_kv.blocks_in_use", "")
    row("  blocks needed (shared once + own)", "prefix_kv.needed_blocks", "")
    row("  one session, bytes", "prefix_kv.one_session_kv_bytes", "")
    row("  sum of SessionInfo.kv_bytes", "prefix_kv.sum_session_kv_bytes", "")
    row("  held / (one + others own tokens)", "prefix_kv.held_vs_one_plus_own", "")
    row("  held < 1.2 one + others own tokens", "prefix_kv.goal", "met")
    row("first token, same prompt, ms", "prefix_ttft.same_prompt_ms", "")
    row("first token, other prompt, ms", "prefix_ttft.other_prompt_ms", "")
    row("  same / other", "prefix_ttft.ratio", "<= 0.10")
    row("Save of all, ms", "prefix_save.save_ms", "")
    row("disk: state files, bytes", "prefix_disk.state_bytes", "")
    row("disk: blocks/, bytes", "prefix_disk.block_bytes", "")
    row("disk: total, bytes", "prefix_disk.total_bytes", "")
    row("stop (SIGTERM), ms", "prefix_restore.stop_ms", "")
    row("restart until Status answers, ms", "prefix_restore.restart_ms", "")
    row("restore all (a Fork of each), ms", "prefix_restore.restore_total_ms", "")
    row("  per session, ms", "prefix_restore.restore_per_session_ms", "")
    row("  first session, ms", "prefix_restore.first_ms", "")
    row("  the others (median), ms", "prefix_restore.later_median_ms", "")
    row("  a Fork once resident (median), ms", "prefix_restore.resident_fork_median_ms", "")
    row("then a 1-token Generate (median), ms", "prefix_restore.then_1_token_median_ms", "")
}' "$log"
