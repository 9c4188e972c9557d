#!/bin/sh
# tests/load/run.sh — llamad under load and faults, on the tiny model.
#
# Scenario 1 (state_dir none, idle_timeout $IDLE_TIMEOUT): baseline RSS and fd
# count after a warm-up, then $CONNS connections generating for $SECS s while
# $IDLE idle connections are held, $HALF connections stall on half a frame
# and ${DISC} of the generations disconnect mid-stream. Then every session
# is dropped and: the load saw no error but BUSY/RESOURCE_EXHAUSTED and no
# protocol violation; the idle connections were held to the end; the half
# frames were closed by the idle timeout; the daemon's fd count is back to
# baseline; the KV pool is all free; RSS is back within 5% of baseline; the
# daemon still answers. A second, plain run of $SECS2 s follows: RSS outside
# the KV pool, 3.5 s idle after each, must not grow by more than 5% from one
# run to the next (the same load again). A third run without the idle
# connections prints the throughput ratio with/without them; it is a speed
# figure, so it is checked by make bench (tests/bench/idle.sh, alternated
# runs), not here: one pair of 4 s runs on a shared 2-core CI machine missed
# 80% by noise (14161 vs 17814 tok/s). STRICT_SPEED=1 makes it a check here.
#
# RSS against the warm baseline: the baseline is taken after one second of
# the same load and 3.5 s idle (llamad gives the pages of free K/V blocks
# back and trims its heap after 2 s idle), so heap and scratch high-water
# marks are in it; after the load, the drops and 3.5 s idle (waiting up to
# 12 s in all for it), RSS must be within 5% of it (STRICT_RSS=0 only notes a
# miss). The breakdown (heap, KV
# pool, other anonymous, files; from /proc/PID/smaps) is printed.

# Scenario 2 (a real state directory, save_delay 1): the load with Save
# requests (every answered Save logged), SIGKILL of the daemon in the
# middle, a restart on the same directory: every session whose last logged
# event is a Save must come back with at least the tokens it was saved with
# and generate; then dropping them all empties the directory.
#
# The generator is $BUILD/llamad-load (make builds it); when that is
# missing (e.g. the TSan build) or LOAD_SAN is set, it is built here:
#   cc -std=c11 -O2 -g -Wall -Wextra -Werror -pthread -D_GNU_SOURCE -I. -I$BUILD/proto \
#      tests/load/load.c proto/frame.c proto/names.c util/grow.c $BUILD/proto/llamad.pb-c.c \
#      $(pkg-config --libs libprotobuf-c) -lm -o llamad-load
# LOAD_SAN=1 adds -fsanitize=address,undefined to the load generator.
#
# With llamad-http built, $HTTP (8) HTTP clients stream chats through it
# during the warm-up and the first run (every tenth cut off after 0.3 s):
# every answer must be 200, and afterwards the gateway answers, holds no
# more descriptors than before and peaked under 20 MiB.
#
# Env: BUILD (build), MODELS (../shared/models), CONNS (64), SECS (8), HTTP (8),
# SECS2 (4), IDLE (1000), HALF (16), DISC (0.05), IDLE_TIMEOUT (10; 20 with a
# sanitizer build),
# STRICT_RSS, STRICT_SPEED, LOAD_SAN, KEEP (keep the temp folder with logs). With a
# sanitizer build of the daemon (BUILD=build-asan) the RSS checks are only
# printed: ASan's allocator keeps freed memory in quarantine; its leak
# report at exit is checked instead (the daemon logs are grepped).
# Takes about 35 s. Exit status 0 when every check passed.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
CONNS=${CONNS:-64}
SECS=${SECS:-8}
SECS2=${SECS2:-4}
IDLE=${IDLE:-1000}
HALF=${HALF:-16}
DISC=${DISC:-0.05}
IDLE_TIMEOUT=${IDLE_TIMEOUT:-}
LLAMAD=$BUILD/llamad
MODEL="--model $MODELS/stories260K.bin --tokenizer $MODELS/tok512.model"

. tests/tools/daemon.sh
need_files "$LLAMAD" "$BUILD/proto/llamad.pb-c.c" "$MODELS/stories260K.bin" "$MODELS/tok512.model"

stop_signal=KILL   # a daemon left running at exit is killed, not asked
test_frame
pass() { echo "PASS $*"; }
note() { echo "NOTE $*"; }

# ---- the load generator: make's, else built here -----------------------------
LOAD=$BUILD/llamad-load
if [ -n "$LOAD_SAN" ] || [ ! -x "$LOAD" ]; then
    LOAD=$dir/llamad-load
    san=
    [ -n "$LOAD_SAN" ] && san="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined"
    # shellcheck disable=SC2046,SC2086  # word splitting on purpose
    cc -std=c11 -O2 -g -Wall -Wextra -Werror -pthread -D_GNU_SOURCE $san -I. -I"$BUILD/proto" \
        tests/load/load.c proto/frame.c proto/names.c util/grow.c "$BUILD/proto/llamad.pb-c.c" \
        $(pkg-config --libs libprotobuf-c) -lm -o "$LOAD" ||
        { echo "FAIL cannot build tests/load/load.c"; exit 1; }
fi

# ---- file descriptors: both processes hold every connection ------------------
want=$((IDLE + CONNS + HALF + 256))
# shellcheck disable=SC3045  # ulimit -n/-H: dash and bash have them
if ! ulimit -n "$want" 2>/dev/null; then
    # shellcheck disable=SC3045
    hard=$(ulimit -H -n)
    [ "$hard" = unlimited ] || {
        # shellcheck disable=SC3045
        ulimit -n "$hard"
        IDLE=$((hard - CONNS - HALF - 256))
        [ "$IDLE" -lt 0 ] && IDLE=0
        note "hard fd limit $hard: idle connections reduced to $IDLE"
    }
fi
MAXCONN=$((IDLE + CONNS + HALF + 64))
san_daemon=
grep -qaE "__asan_init|__tsan_init" "$LLAMAD" && san_daemon=1
# the idle connections must outlive the run, in-flight generations drained
# (a sanitizer build on a slow machine takes 11 s for the 8 s run)
[ -n "$IDLE_TIMEOUT" ] || { [ -n "$san_daemon" ] && IDLE_TIMEOUT=20 || IDLE_TIMEOUT=10; }

# ---- helpers -------------------------------------------------------------------
start_daemon() {  # log-file extra-args...
    log=$1; shift
    sock=$dir/sock
    # shellcheck disable=SC2086
    "$LLAMAD" $MODEL --socket "$sock" --log-level ${LOAD_LOG_LEVEL:-warning} "$@" 2>>"$log" &
    pid=$!
    i=0
    while ! "$BUILD/llamactl" --socket "$sock" status >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 100 ] || ! kill -0 "$pid" 2>/dev/null; then
            echo "FAIL the daemon did not start:"; cat "$log"; exit 1
        fi
        sleep 0.1
    done
}
rss_kb()  { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }
nfds()    { ls "/proc/$pid/fd" | wc -l; }
# resident kB by kind: "heap H pool P anon A file F" (pool: the anonymous
# mapping the size of kv_memory; anon: other anonymous mappings, stacks)
breakdown() {
    kv=$(jnum kv_bytes_total)
    awk -v lo=$((kv / 1024)) -v hi=$((kv / 1024 + 8192)) '
        /^[0-9a-f]+-[0-9a-f]+ / { name = $6; if (name == "") name = "anon" }
        /^Size:/ { size = $2 }
        /^Rss:/ {
            if (name == "[heap]") k = "heap"
            else if (name == "anon" && size >= lo && size <= hi) k = "pool"
            else if (name == "anon" || name ~ /^\[/) k = "anon"
            else k = "file"
            r[k] += $2
        }
        END { printf "heap %d pool %d anon %d file %d\n", r["heap"], r["pool"], r["anon"], r["file"] }' \
        "/proc/$pid/smaps"
}
breakdown_diff() {  # file-a file-b
    paste "$1" "$2" | awk '{ printf "heap %d->%d, KV pool %d->%d, other anon %d->%d, files %d->%d",
        $2, $10, $4, $12, $6, $14, $8, $16 }'
}
field() {  # key file: the value of key=... in the load's summary line
    sed -n "s/^load: .*[ ]$1=\([^ ]*\).*/\1/p" "$2" | tail -n 1
}
jnum() {  # key: a number from `llamactl --json status`
    "$BUILD/llamactl" --socket "$sock" --json status | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"
}
pct() {  # a b: 100 * (a - b) / b, one decimal
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b ? 100 * (a - b) / b : 0 }'
}
within() {  # a b pct: |a - b| <= pct% of b
    awk -v a="$1" -v b="$2" -v p="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= b * p / 100) }'
}
daemon_log_clean() {  # log
    if grep -q 'Error from accept' "$1"; then
        bad "the daemon ran out of file descriptors: $(grep -c 'Error from accept' "$1") accept errors logged"
    fi
    if grep -Eq 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$1"; then
        bad "sanitizer report in the daemon log:"; grep -E -A5 'Sanitizer|runtime error' "$1" | head -20
    fi
}
# ==== scenario 1: load, idle connections, half frames, disconnects ============
echo "== scenario 1: $CONNS connections for $SECS s, $IDLE idle, $HALF half frames, disconnect rate $DISC"
log1=$dir/daemon1.log
# prefix_cache_time 1: the blocks of prefixes the dropped sessions leave
# (reusable, so kept) go back to the system after 1 s idle, not 300
start_daemon "$log1" --state-dir none --max-connections "$MAXCONN" --idle-timeout "$IDLE_TIMEOUT" \
    --prefix-cache-time 1

# HTTP clients beside the protocol load, through llamad-http (when built):
# $HTTP shell loops, each sending streamed chat requests (a new
# conversation, or the second turn of its last one) for SECONDS; every
# tenth is cut off by curl after 0.3 s. Their statuses go to
# $dir/http.codes ("code max-time" a line).
HTTP=${HTTP:-8}
GWBIN=$BUILD/llamad-http
[ -x "$GWBIN" ] || HTTP=0
http_clients() {  # seconds
    i=0
    while [ "$i" -lt "$HTTP" ]; do
        ( end=$(($(date +%s) + $1)); n=0
          while [ "$(date +%s)" -lt "$end" ]; do
              n=$((n + 1)); mt=10; [ $((n % 10)) -eq 0 ] && mt=0.3
              if [ $((n % 2)) -eq 0 ]; then
                  msgs='[{"role":"user","content":"Client '$i' story '$((n - 1))'"},{"role":"assistant","content":"Once upon a time"},{"role":"user","content":"Go on"}]'
              else
                  msgs='[{"role":"user","content":"Client '$i' story '$n'"}]'
              fi
              c=$(curl -s -o /dev/null -w '%{http_code}' --max-time "$mt" --unix-socket "$dir/h.sock" \
                  http://x/v1/chat/completions -d '{"model":"m","stream":true,"max_tokens":24,"messages":'"$msgs"'}')
              echo "$c $mt" >>"$dir/http.codes"
          done ) &
        i=$((i + 1))
    done
}
if [ "$HTTP" -gt 0 ]; then
    "$GWBIN" --socket "$sock" --name m --listen "$dir/h.sock" --max-conversations 16 -q 2>"$dir/gw.log" &
    gwpid=$!
    i=0; while [ ! -S "$dir/h.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
fi

# warm-up: one second of the same load (every request kind, the idle
# connections too), then drop everything and let the daemon go idle: after
# 2 s idle it gives back the free K/V blocks' pages and trims its heap, so
# the baseline is a warmed-up idle daemon
[ "$HTTP" -gt 0 ] && http_clients 1
"$LOAD" --socket "$sock" --conns "$CONNS" --seconds 1 --idle "$IDLE" --prefix warm \
    >"$dir/warm.out" 2>&1 || { bad "warm-up load failed:"; cat "$dir/warm.out"; }
wait_http() { for p in $(jobs -p); do [ "$p" = "$pid" ] || [ "$p" = "${gwpid:-}" ] || wait "$p"; done; }
wait_http
"$LOAD" --socket "$sock" --cleanup >/dev/null
: >"$dir/http.codes"
sleep 3.5
base_rss=$(rss_kb); base_fds=$(nfds); breakdown >"$dir/bd0"
[ "$HTTP" -gt 0 ] && gw_fds0=$(ls "/proc/$gwpid/fd" | wc -l)
lim=$(awk '/^Max open files/ { print $4 }' "/proc/$pid/limits")
echo "baseline: rss ${base_rss} kB, ${base_fds} fds (daemon fd limit $lim, max_connections $MAXCONN)"

# the fd count and RSS while the load runs (sampled in the middle)
( sleep "$(awk -v s="$SECS" 'BEGIN { print s / 2 }')"
  echo "$(nfds) $(rss_kb)" >"$dir/peak" ) &
sampler=$!
[ "$HTTP" -gt 0 ] && http_clients "$SECS"
"$LOAD" --socket "$sock" --conns "$CONNS" --seconds "$SECS" --idle "$IDLE" \
    --half-frames "$HALF" --half-frame-wait $((IDLE_TIMEOUT + 5)) --disconnect-rate "$DISC" \
    >"$dir/load1.out" 2>&1
rc=$?
wait "$sampler"
if [ "$HTTP" -gt 0 ]; then
    wait_http
    total=$(wc -l <"$dir/http.codes")
    bad_codes=$(awk '$2 == 10 && $1 != 200 || $2 != 10 && $1 != 200 && $1 != "000"' "$dir/http.codes" | sort | uniq -c | tr '\n' ' ')
    cut=$(awk '$2 != 10' "$dir/http.codes" | wc -l)
    gw_fds=$(ls "/proc/$gwpid/fd" | wc -l)
    gw_rss=$(awk '/^VmHWM/ { print $2 }' "/proc/$gwpid/status")
    if [ "$total" -gt 0 ] && [ -z "$bad_codes" ]; then
        pass "HTTP: $HTTP clients, $total requests through llamad-http ($cut cut off by the client), all 200"
    else bad "HTTP: $total requests, unexpected statuses: $bad_codes"; tail -5 "$dir/gw.log"; fi
    # (a sanitizer build's RSS is ASan's: not checked)
    grep -qa __asan_init "$GWBIN" && gw_rss_max=1000000 || gw_rss_max=20480
    curl -s --max-time 5 --unix-socket "$dir/h.sock" http://x/health | grep -q ok &&
        [ "$gw_fds" -le "$gw_fds0" ] && [ "$gw_rss" -lt "$gw_rss_max" ] &&
        pass "HTTP: the gateway answers after the load, $gw_fds fds (baseline $gw_fds0), peak RSS $gw_rss kB" ||
        bad "HTTP: gateway after the load: fds $gw_fds (baseline $gw_fds0), peak RSS $gw_rss kB"
fi
cat "$dir/load1.out"
if [ "$rc" -eq 0 ]; then pass "load: exit 0 (no error but busy/exhausted, no protocol violation)"
else bad "load exited $rc"; fi
o=$dir/load1.out
req=$(field requests "$o"); toks=$(field tokens "$o"); tps=$(field tok_s "$o")
errs=$(field errors "$o"); allowed=$(field errors_allowed "$o"); viol=$(field violations "$o")
idle_closed=$(field idle_closed "$o"); idle_n=$(field idle "$o")
half_closed=$(field half_closed "$o"); half_max=$(field half_max_s "$o")
served=$(field served "$o"); disc=$(field disconnects "$o")
echo "numbers: requests=$req tokens=$toks tok_s=$tps first_p50_ms=$(field first_p50_ms "$o")" \
     "first_p99_ms=$(field first_p99_ms "$o") token_p50_ms=$(field token_p50_ms "$o")" \
     "token_p99_ms=$(field token_p99_ms "$o") disconnects=$disc errors=$errs busy_or_exhausted=$allowed"
[ "${req:-0}" -gt 0 ] && [ "${toks:-0}" -gt 0 ] || bad "no requests served (requests=$req tokens=$toks)"
[ "$errs" = 0 ] && [ "$viol" = 0 ] || bad "errors=$errs violations=$viol"
if [ "$idle_n" = "$IDLE" ] && [ "$idle_closed" = 0 ]; then
    pass "idle connections: $idle_n held for the whole run"
else bad "idle connections: $idle_n of $IDLE opened, $idle_closed closed during the run"; fi
read -r peak_fds peak_rss <"$dir/peak"
if [ "$peak_fds" -ge $((base_fds + IDLE + CONNS)) ]; then
    pass "daemon held $peak_fds fds during the load (baseline $base_fds)"
else bad "daemon held only $peak_fds fds during the load (baseline $base_fds + $IDLE idle + $CONNS)"; fi
if [ "$half_closed" = "$HALF" ] &&
   awk -v m="$half_max" -v t="$IDLE_TIMEOUT" 'BEGIN { exit !(m >= t - 1 && m <= t + 3) }'; then
    pass "half frames: $half_closed of $HALF closed by the idle timeout (after ${half_max} s, timeout ${IDLE_TIMEOUT} s)"
else bad "half frames: $half_closed of $HALF closed, the last after ${half_max} s (timeout ${IDLE_TIMEOUT} s)"; fi
[ "$served" = 1 ] && pass "daemon answered during and after the load" || bad "daemon stopped serving"

# every session dropped; let the connections close and the daemon go idle
"$LOAD" --socket "$sock" --cleanup >/dev/null || bad "cleanup failed"
# the daemon gives memory back after 2 s without work; closing a thousand
# connections on a busy machine can put that off, so wait up to 12 s for it
sleep 3.5
waited=3.5
while [ -z "$san_daemon" ] && ! within "$(rss_kb)" "$base_rss" 5 &&
      awk -v w="$waited" 'BEGIN { exit !(w < 12) }'; do
    sleep 0.5
    waited=$(awk -v w="$waited" 'BEGIN { print w + 0.5 }')
done
after_rss=$(rss_kb); after_fds=$(nfds); breakdown >"$dir/bd1"
sessions=$(jnum sessions); kv_free=$(jnum kv_blocks_free); kv_total=$(jnum kv_blocks_total)
echo "after: rss ${after_rss} kB, ${after_fds} fds, ${waited} s after the cleanup (during the load: rss ${peak_rss} kB)"
[ "$after_fds" = "$base_fds" ] && pass "fds back to baseline ($after_fds)" ||
    bad "fds: $after_fds after, $base_fds at baseline"
[ "$sessions" = 0 ] && [ "$kv_free" = "$kv_total" ] &&
    pass "no session left, KV pool all free ($kv_free of $kv_total blocks)" ||
    bad "sessions=$sessions kv_blocks_free=$kv_free of $kv_total"
echo "rss breakdown kB (baseline -> after): $(breakdown_diff "$dir/bd0" "$dir/bd1")"
if [ -n "$san_daemon" ]; then
    note "rss ${after_rss} kB vs ${base_rss} kB at baseline: not checked, $LLAMAD is a sanitizer build" \
         "(its allocator keeps freed memory in quarantine)"
elif within "$after_rss" "$base_rss" 5; then
    pass "rss ${after_rss} kB vs ${base_rss} kB at baseline ($(pct "$after_rss" "$base_rss")%)"
elif [ "${STRICT_RSS:-1}" != 0 ]; then
    bad "rss ${after_rss} kB vs ${base_rss} kB at baseline ($(pct "$after_rss" "$base_rss")%)"
else
    note "rss ${after_rss} kB vs ${base_rss} kB at baseline ($(pct "$after_rss" "$base_rss")%," \
         "not within 5%; STRICT_RSS=0: noted only)"
fi

# the same load again (no half frames): RSS must not grow from run to run
"$LOAD" --socket "$sock" --conns "$CONNS" --seconds "$SECS2" --idle "$IDLE" --disconnect-rate "$DISC" \
    >"$dir/load2.out" 2>&1 || { bad "second load failed:"; cat "$dir/load2.out"; }
"$LOAD" --socket "$sock" --cleanup >/dev/null
# as idle as after the first run (memory given back after 2 s idle), so the
# two readings compare the same state
sleep 3.5
rss2=$(rss_kb); fds2=$(nfds); tps2=$(field tok_s "$dir/load2.out"); breakdown >"$dir/bd2"
echo "second run ($IDLE idle): tok_s=$tps2 token_p50_ms=$(field token_p50_ms "$dir/load2.out") rss ${rss2} kB, ${fds2} fds"
echo "rss breakdown kB (after run 1 -> after run 2): $(breakdown_diff "$dir/bd1" "$dir/bd2")"
# outside the KV pool (whose leaks the free-block count above catches, and
# whose resident pages follow the peak of blocks in use at once)
o1=$(awk '{ print $2 + $6 + $8 }' "$dir/bd1"); o2=$(awk '{ print $2 + $6 + $8 }' "$dir/bd2")
if [ -n "$san_daemon" ]; then
    note "rss from run to run: not checked under a sanitizer (${o1} kB -> ${o2} kB outside the pool)"
elif within "$o2" "$o1" 5 || [ "$o2" -le "$o1" ]; then
    pass "rss outside the KV pool after a second run: ${o2} kB vs ${o1} kB after the first ($(pct "$o2" "$o1")%; whole rss ${rss2} vs ${after_rss} kB)"
else bad "rss outside the KV pool grew from run to run: ${o2} kB vs ${o1} kB ($(pct "$o2" "$o1")%)"; fi
[ "$fds2" = "$base_fds" ] || bad "fds after the second run: $fds2, baseline $base_fds"
[ "$(jnum kv_blocks_free)" = "$kv_total" ] || bad "KV blocks in use after the second run and cleanup"

# and without the idle connections: they must not slow the active ones
"$LOAD" --socket "$sock" --conns "$CONNS" --seconds "$SECS2" --disconnect-rate "$DISC" \
    >"$dir/load3.out" 2>&1 || { bad "third load failed:"; cat "$dir/load3.out"; }
"$LOAD" --socket "$sock" --cleanup >/dev/null
tps3=$(field tok_s "$dir/load3.out")
echo "third run (no idle): tok_s=$tps3 token_p50_ms=$(field token_p50_ms "$dir/load3.out") token_p99_ms=$(field token_p99_ms "$dir/load3.out")"
ratio=$(awk -v a="$tps2" -v b="$tps3" 'BEGIN { printf "%.0f", (b > 0 ? 100 * a / b : 0) }')
if [ "${STRICT_SPEED:-0}" = 1 ] && [ -z "$san_daemon" ]; then
    [ "$ratio" -ge 80 ] &&
        pass "throughput with $IDLE idle connections: $tps2 tok/s vs $tps3 without ($ratio%)" ||
        bad "throughput with $IDLE idle connections: $tps2 tok/s vs $tps3 without ($ratio% < 80%)"
else  # a speed figure: make bench checks it (tests/bench/idle.sh)
    note "throughput with $IDLE idle connections: $tps2 tok/s vs $tps3 without ($ratio%;" \
         "checked by make bench, or here with STRICT_SPEED=1)"
fi
"$BUILD/llamactl" --socket "$sock" generate --raw --temperature 0 --max-tokens 8 "Once upon a time" \
    >"$dir/gen" 2>&1 && [ -s "$dir/gen" ] && pass "daemon still generates" ||
    bad "daemon does not generate: $(cat "$dir/gen")"
if [ "$HTTP" -gt 0 ]; then
    kill "$gwpid"; wait "$gwpid"; grc=$?
    [ "$grc" -eq 0 ] || bad "llamad-http exited $grc on SIGTERM"
    ! grep -Eq 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$dir/gw.log" ||
        { bad "sanitizer report in the gateway's log:"; grep -E -A5 'Sanitizer|runtime error' "$dir/gw.log" | head -20; }
fi
kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"
daemon_log_clean "$log1"

# ==== scenario 2: SIGKILL under load, restart, saved sessions come back =======
echo "== scenario 2: SIGKILL under load with a state directory"
state=$dir/state
log2=$dir/daemon2.log
start_daemon "$log2" --state-dir "$state" --save-delay 1
"$LOAD" --socket "$sock" --conns 32 --seconds 30 --save-rate 0.3 --saved-log "$dir/saved.log" \
    --disconnect-rate 0.02 --expect-kill --keep-sessions --prefix crash >"$dir/load3.out" 2>&1 &
lpid=$!
# under load for 4 s and until a Save has been answered (up to 29 s: a
# sanitizer build on a slow machine answers its first ones after 4 s)
sleep 4
i=0
while ! grep -q '^saved ' "$dir/saved.log" 2>/dev/null && [ $i -lt 250 ]; do
    i=$((i + 1)); sleep 0.1
done
sleep 0.5
kill -KILL "$pid"; wait "$pid" 2>/dev/null; pid=
i=0
while kill -0 "$lpid" 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 100 ] && { kill "$lpid"; bad "the load did not notice the daemon died"; break; }
    sleep 0.1
done
wait "$lpid"; rc=$?
cat "$dir/load3.out"
gone=$(field daemon_gone "$dir/load3.out")
[ "$rc" -eq 0 ] && [ "$gone" = 1 ] && pass "load until SIGKILL: no error, no violation" ||
    bad "load under SIGKILL: exit $rc, daemon_gone=$gone"
nsaved=$(grep -c '^saved ' "$dir/saved.log" 2>/dev/null)
[ "${nsaved:-0}" -gt 0 ] || bad "no Save was answered before the kill"
start_daemon "$log2" --state-dir "$state" --save-delay 1
on_disk=$(jnum sessions_on_disk)
"$LOAD" --socket "$sock" --check-saved "$dir/saved.log" >"$dir/check.out" 2>&1; rc=$?
cat "$dir/check.out"
[ "$rc" -eq 0 ] && pass "after SIGKILL and restart: every saved session is back and generates ($nsaved saves logged, $on_disk sessions on disk)" ||
    bad "saved sessions after SIGKILL: see above"
"$LOAD" --socket "$sock" --cleanup >/dev/null || bad "cleanup failed"
# the lock file is the daemon's; blocks/ holds the shared blocks, none left
left=$(ls -A "$state" | grep -vx -e llamad.lock -e blocks | wc -l)
nblk=$(ls -A "$state/blocks" 2>/dev/null | wc -l)
[ "$left" -eq 0 ] && [ "$nblk" -eq 0 ] &&
    pass "state directory empty after dropping every session (but its lock file, an empty blocks/)" ||
    bad "state directory holds $left files and $nblk in blocks/ after dropping every session: $(ls -A "$state" "$state/blocks" | head -8)"
kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"
daemon_log_clean "$log2"

if [ "$fail" -eq 0 ]; then echo "load: all ok"; else
    echo "load: FAILED (daemon logs: KEEP=1 keeps $dir)"; fi
exit "$fail"
