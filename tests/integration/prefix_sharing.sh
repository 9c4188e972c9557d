#!/bin/sh
# tests/integration/prefix_sharing.sh — sessions of one owner that begin
# alike share the K/V blocks of that beginning (stories260K, context 512).
# One workload runs against a daemon with prefix sharing on (the default)
# and against one with it off (--prefix-sharing off), each fresh, in f32
# and in f16 K/V: a 180-token common beginning (raw text, BOS included)
# followed by six different endings; the first session alone, the other
# five at once (background llamactl, a slowed model so that they share
# forward passes); a fork of one of them, generating in both; a drop of
# the fork's source, generating in the fork; a rewind of another and a new
# answer, then a new session with its prompt; everything dropped, then a
# new session with the first prompt. Greedy, fixed -n. Checks:
#  - every answer is the same with sharing on and off; a fork and its
#    source answer alike; a session whose prompt another had answered
#    before a rewind answers as that one did;
#  - on: Done.shared_tokens of each session after the first is exactly
#    the whole blocks its prompt has in common with the first, less the
#    block of its last token; Counters.prefix_hit_tokens, their sum;
#    off: 0 everywhere, Status.prefix_sharing false;
#  - after every session is dropped, the free blocks still hold the
#    prefix (Status.kv_blocks_cached > 0; off: 0) and a new session takes
#    them (shared_tokens as before, the first session's answer);
#  - llamactl status says it in text ("sharing: prefix sharing on, ..."),
#    and -v after an answer ("prompt N tokens (+M shared)");
#  - prefix_sharing is reloaded by SIGHUP (off: nothing shared; on again:
#    the cached blocks are taken);
#  - sharing never crosses owners (as root, with setpriv: uid 65534's
#    session with the first prompt shares nothing while root's blocks are
#    held, its second session shares its own first's; the answers are
#    root's); skipped with a message when not root;
#  - a pool of 51 blocks (--kv-memory 1M, --ram-cache 0): ten sessions with
#    the beginning, each moved to disk and back as the others run, then
#    continued: the answers are the same on and off, and sessions moved
#    out come back (restores > 0) on both;
#  - max_kv_share_per_uid counts a block several of an owner's sessions
#    share once (root: uid 65534's share of that pool is 25 blocks; two of
#    its sessions with the beginning stay in it with sharing on, the first
#    leaves it with sharing off).
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$BUILD/llamad" "$BUILD/llamactl" "$MODELS/stories260K.bin" "$MODELS/tok512.model"
ROOT=0
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    ROOT=1
    test_frame 755   # uid 65534 reaches the socket in it
    cp "$BUILD/llamactl" "$dir/llamactl" && chmod 755 "$dir/llamactl"
else
    test_frame
fi
CTL=$BUILD/llamactl
SOCK=$dir/s
NOBODY=65534

# the common beginning (179 tokens; 180 with BOS) and six endings
SYS="Once upon a time, in a small town near a big green forest, there lived a little \
girl named Lily. Lily had a red ball, a brown dog called Max and a best friend named \
Tom. Every morning Lily and Tom walked to the park with Max. They played with the \
ball, ran under the tall trees and looked at the birds in the sky. Their mom always \
told them to be kind, to share their toys and to come home before it was dark. One \
sunny day,"
Q0=" Lily found a shiny key"
Q1=" Tom saw a big box"
Q2=" Max barked at a cat"
Q3=" the sky turned dark"
Q4=" a bird sang a song"
Q5=" their mom made a cake"

cat >"$dir/j.py" <<'PY'
import json, sys
def last_done(path):
    done = None
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if line.startswith("{"):
            o = json.loads(line)
            if o.get("event") == "done":
                done = o
    return done
cmd = sys.argv[1]
if cmd == "result":    # result FILE: text (JSON), shared_tokens, prompt_tokens
    d = last_done(sys.argv[2])
    if d is None:
        print("none\t-1\t-1")
    else:
        print("%s\t%s\t%s" % (json.dumps(d["text"]), d.get("shared_tokens", -1),
                              d.get("prompt_tokens", -1)))
elif cmd == "get":     # get FILE KEY[.KEY]: a value of a JSON object
    o = json.load(open(sys.argv[2]))
    for k in sys.argv[3].split("."):
        o = o.get(k) if isinstance(o, dict) else None
    print("null" if o is None else json.dumps(o))
elif cmd == "expect":  # expect BS HELD.json NEW.json: tokens NEW may share
    bs = int(sys.argv[2])
    a = json.load(open(sys.argv[3]))["tokens"]
    b = json.load(open(sys.argv[4]))["tokens"]
    cp = 0
    while cp < min(len(a), len(b)) and a[cp] == b[cp]:
        cp += 1
    # whole blocks of the common part, never the block of b's last token
    print(bs * min(cp // bs, (len(b) - 1) // bs))
PY
j() { python3 "$dir/j.py" "$@"; }

start() {  # start LABEL ARGS...: a fresh daemon (state in $dir/state-LABEL)
    _l=$1; shift
    rm -f "$SOCK"
    LLAMAD_TEST_STEP_DELAY_MS=${DELAY:-0} "$BUILD/llamad" --model "$MODELS/stories260K.bin" \
        --tokenizer "$MODELS/tok512.model" --socket "$SOCK" --socket-mode 0666 \
        --state-dir "$dir/state-$_l" --threads 1 --log-level info "$@" 2>>"$dir/llamad-$_l.log" &
    pid=$!
    wait_socket "$SOCK" "$pid" "$dir/llamad-$_l.log" 30
}
stop() {
    kill -TERM "$pid" && wait "$pid" || bad "llamad exited with $?"
    pid=
}
ctl() { "$CTL" --socket "$SOCK" "$@"; }
status() {  # status OUT: the status as JSON in $dir/OUT.json
    ctl --json status >"$dir/$1.json" 2>"$dir/$1.err" || bad "status: $(cat "$dir/$1.err")"
}
# gen OUT SESSION N TEXT: N greedy tokens after raw TEXT in SESSION, --json
# into $dir/OUT.json; then res OUT gives "text<TAB>shared<TAB>prompt"
gen() {
    ctl --json generate --session "$2" --raw -n "$3" --temperature 0 "$4" \
        >"$dir/$1.json" 2>"$dir/$1.err" || bad "generate $2 ($1): $(cat "$dir/$1.err")"
}
res() { j result "$dir/$1.json"; }
text() { res "$1" | cut -f1; }
shared() { res "$1" | cut -f2; }
# record LABEL OUT NAME: NAME's answer (OUT) into $dir/LABEL.answers
record() { printf '%s\t%s\n' "$3" "$(text "$2")" >>"$dir/$1.answers"; }

# ---- the tokens each prompt may take from the first ---------------------------------
start tok
status tok
BS=$(j get "$dir/tok.json" kv_block_tokens)
for i in 0 1 2 3 4 5; do
    eval "q=\$Q$i"
    ctl --json tokenize --bos "$SYS$q" >"$dir/tok$i.json" || bad "tokenize $i"
done
ctl --json tokenize --bos "$SYS" >"$dir/toksys.json" || bad "tokenize the beginning"
stop
nsys=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['tokens']))" \
    "$dir/toksys.json")
for i in 0 1 2 3 4 5; do
    eval "X$i=\$(j expect $BS \"\$dir/tok0.json\" \"\$dir/tok$i.json\")"
done
[ "$X1" -gt 0 ] && [ "$X1" -le "$nsys" ] && ok "the beginning: $nsys tokens, $X1 in whole blocks of $BS" ||
    bad "the prompts share $X1 tokens in whole blocks ($nsys in the beginning)"

# ---- the workload ------------------------------------------------------------------
# workload LABEL ON: against the running daemon; ON 1 when sharing is on
workload() {
    L=$1 on=$2
    : >"$dir/$L.answers"
    gen "$L-s0" s0 24 "$SYS$Q0"
    record "$L" "$L-s0" s0
    [ "$(shared "$L-s0")" = 0 ] || bad "$L: the first session shared $(shared "$L-s0") tokens"
    status "$L-st0"
    p0=$(j get "$dir/$L-st0.json" counters.forward_passes)
    # five at once; each waits for nothing but the daemon
    bg=
    for i in 1 2 3 4 5; do
        eval "q=\$Q$i"
        gen "$L-s$i" "s$i" 24 "$SYS$q" &
        bg="$bg $!"
    done
    for p in $bg; do wait "$p"; done
    status "$L-st1"
    p1=$(j get "$dir/$L-st1.json" counters.forward_passes)
    [ $((p1 - p0)) -lt 120 ] && ok "$L: five sessions ran together ($((p1 - p0)) forward passes for 120 tokens)" ||
        bad "$L: the five sessions did not share forward passes ($((p1 - p0)) for 120 tokens)"
    sum=0 wrong=
    for i in 1 2 3 4 5; do
        record "$L" "$L-s$i" "s$i"
        got=$(shared "$L-s$i")
        eval "want=\$X$i"
        [ "$on" -eq 1 ] || want=0
        [ "$got" = "$want" ] || wrong="$wrong s$i:$got/$want"
        sum=$((sum + got))
    done
    [ -z "$wrong" ] && ok "$L: Done.shared_tokens of s1..s5 as expected ($sum in all)" ||
        bad "$L: shared_tokens got/expected:$wrong"
    hit=$(j get "$dir/$L-st1.json" counters.prefix_hit_tokens)
    [ "$hit" = "$sum" ] && ok "$L: Counters.prefix_hit_tokens $hit" ||
        bad "$L: prefix_hit_tokens $hit, the sessions say $sum"
    ps=$(j get "$dir/$L-st1.json" prefix_sharing)
    if [ "$on" -eq 1 ]; then want=true; else want=false; fi
    [ "$ps" = "$want" ] || bad "$L: Status.prefix_sharing $ps"

    # a fork of a session that shares blocks; both go on alike
    ctl fork s1 f1 >/dev/null 2>"$dir/$L-fork.err" || bad "$L: fork: $(cat "$dir/$L-fork.err")"
    gen "$L-f1a" f1 16 " And then"
    gen "$L-s1a" s1 16 " And then"
    record "$L" "$L-f1a" f1a
    record "$L" "$L-s1a" s1a
    [ "$(text "$L-f1a")" = "$(text "$L-s1a")" ] && ok "$L: a fork and its source answer alike" ||
        bad "$L: fork '$(text "$L-f1a")', source '$(text "$L-s1a")'"
    # its source dropped, the fork goes on
    ctl drop s1 >/dev/null 2>"$dir/$L-drop.err" || bad "$L: drop s1: $(cat "$dir/$L-drop.err")"
    gen "$L-f1b" f1 16 " Later that day"
    record "$L" "$L-f1b" f1b

    [ "$ROOT" -eq 1 ] && [ "$on" -eq 1 ] && other_owner "$L"

    # a rewound session writes over blocks it held alone and had named (its
    # answer's); a new session with its prompt still answers as it did
    ctl rewind s2 2>"$dir/$L-rw.err" || bad "$L: rewind s2: $(cat "$dir/$L-rw.err")"
    gen "$L-s2r" s2 24 " Then a dog came"
    record "$L" "$L-s2r" s2r
    gen "$L-r2" r2 24 "$SYS$Q2"
    record "$L" "$L-r2" r2
    [ "$(text "$L-r2")" = "$(text "$L-s2")" ] &&
        ok "$L: after a rewind and another answer, the first answer again for its prompt" ||
        bad "$L: after s2's rewind: '$(text "$L-r2")', before: '$(text "$L-s2")'"

    # everything dropped; a new session with the first prompt
    for s in s0 s2 s3 s4 s5 f1 r2; do
        ctl drop $s >/dev/null 2>"$dir/$L-drop.err" || bad "$L: drop $s: $(cat "$dir/$L-drop.err")"
    done
    status "$L-st2"
    cached=$(j get "$dir/$L-st2.json" kv_blocks_cached)
    free=$(j get "$dir/$L-st2.json" kv_blocks_free)
    total=$(j get "$dir/$L-st2.json" kv_blocks_total)
    [ "$free" = "$total" ] || bad "$L: all dropped, $free of $total blocks free"
    if [ "$on" -eq 1 ]; then
        [ "$cached" -ge $((X1 / BS)) ] && ok "$L: all dropped, $cached free blocks hold prefixes" ||
            bad "$L: all dropped, kv_blocks_cached $cached"
    else
        [ "$cached" = 0 ] || bad "$L: sharing off, kv_blocks_cached $cached"
    fi
    gen "$L-n1" n1 24 "$SYS$Q0"
    record "$L" "$L-n1" n1
    want=$X0
    [ "$on" -eq 1 ] || want=0
    # Q0 is the first prompt itself: all its whole blocks but the last one's
    [ "$(shared "$L-n1")" = "$want" ] && ok "$L: a new session after the drops shared $want tokens" ||
        bad "$L: new session after the drops: shared_tokens $(shared "$L-n1"), expected $want"
    [ "$(text "$L-n1")" = "$(text "$L-s0")" ] && ok "$L: ... and answered as the first session" ||
        bad "$L: after the drops '$(text "$L-n1")', first '$(text "$L-s0")'"

    # -v says it on stderr
    ctl -v generate --session v3 --raw -n 4 --temperature 0 "$SYS$Q3" >/dev/null 2>"$dir/$L-v.err" ||
        bad "$L: generate -v: $(cat "$dir/$L-v.err")"
    if [ "$on" -eq 1 ]; then
        grep -q "^llamactl: prompt [0-9]* tokens (+$X3 shared) in " "$dir/$L-v.err" &&
            ok "$L: -v: prompt N tokens (+$X3 shared)" || bad "$L: -v: $(cat "$dir/$L-v.err")"
    else
        grep -q "^llamactl: prompt [0-9]* tokens in " "$dir/$L-v.err" ||
            bad "$L: -v: $(cat "$dir/$L-v.err")"
    fi
    ctl drop v3 >/dev/null || bad "$L: drop v3"
    ctl status >"$dir/$L-status.txt" 2>&1
    status "$L-st3"
    if [ "$on" -eq 1 ]; then w=on; else w=off; fi
    line="sharing:      prefix sharing $w, $(j get "$dir/$L-st3.json" kv_blocks_cached) free blocks cached, $(j get "$dir/$L-st3.json" counters.prefix_hit_tokens) prompt tokens shared"
    grep -qxF "$line" "$dir/$L-status.txt" && ok "$L: llamactl status: '$line'" ||
        bad "$L: llamactl status lacks '$line': $(grep sharing "$dir/$L-status.txt")"
}

# other_owner LABEL: uid 65534 with root's prompts
other_owner() {
    U="setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups $dir/llamactl --socket $SOCK"
    $U --json generate --session u0 --raw -n 24 --temperature 0 "$SYS$Q0" \
        >"$dir/$1-u0.json" 2>"$dir/$1-u0.err" || bad "$1: uid $NOBODY: $(cat "$dir/$1-u0.err")"
    $U --json generate --session u1 --raw -n 24 --temperature 0 "$SYS$Q1" \
        >"$dir/$1-u1.json" 2>"$dir/$1-u1.err" || bad "$1: uid $NOBODY: $(cat "$dir/$1-u1.err")"
    [ "$(shared "$1-u0")" = 0 ] && ok "$1: uid $NOBODY shares none of root's blocks" ||
        bad "$1: uid $NOBODY's first session shared $(shared "$1-u0") tokens of root's"
    [ "$(shared "$1-u1")" = "$X1" ] && ok "$1: uid $NOBODY's second session shares its first's ($X1)" ||
        bad "$1: uid $NOBODY's second session shared $(shared "$1-u1"), expected $X1"
    [ "$(text "$1-u0")" = "$(text "$1-s0")" ] && [ "$(text "$1-u1")" = "$(text "$1-s1")" ] &&
        ok "$1: uid $NOBODY's answers are root's" ||
        bad "$1: uid $NOBODY answered '$(text "$1-u0")', '$(text "$1-u1")'"
    $U drop u0 >/dev/null 2>&1 && $U drop u1 >/dev/null 2>&1 || bad "$1: uid $NOBODY: drop"
}
[ "$ROOT" -eq 1 ] || echo "skipped: sharing across owners (not root, or no setpriv)"

for t in f32 f16; do
    printf 'prefix_sharing = on\n' >"$dir/$t.conf"
    DELAY=8 start "$t-on" --kv-type "$t" --config "$dir/$t.conf"
    workload "$t-on" 1
    if [ "$t" = f32 ]; then
        # reload: off, then on again
        printf 'prefix_sharing = off\n' >"$dir/$t.conf"
        kill -HUP "$pid"
        i=0
        while ! grep -q reloaded "$dir/llamad-$t-on.log" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        status "$t-hup1-st"
        gen "$t-hup1" h1 24 "$SYS$Q1"
        [ "$(j get "$dir/$t-hup1-st.json" prefix_sharing)" = false ] && [ "$(shared "$t-hup1")" = 0 ] &&
            [ "$(text "$t-hup1")" = "$(text "$t-on-s1")" ] &&
            ok "$t: SIGHUP prefix_sharing = off: nothing shared, the same answer" ||
            bad "$t: after reload off: $(cat "$dir/$t-hup1-st.json"; res "$t-hup1")"
        printf 'prefix_sharing = on\n' >"$dir/$t.conf"
        kill -HUP "$pid"
        i=0
        while [ "$(grep -c reloaded "$dir/llamad-$t-on.log")" -lt 2 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        gen "$t-hup2" h2 24 "$SYS$Q2"
        [ "$(shared "$t-hup2")" = "$X2" ] && [ "$(text "$t-hup2")" = "$(text "$t-on-s2")" ] &&
            ok "$t: SIGHUP prefix_sharing = on: $X2 tokens shared again, the same answer" ||
            bad "$t: after reload on: $(res "$t-hup2") (s2: $(res "$t-on-s2"))"
    fi
    stop
    DELAY=8 start "$t-off" --kv-type "$t" --prefix-sharing off
    workload "$t-off" 0
    stop
    if cmp -s "$dir/$t-on.answers" "$dir/$t-off.answers"; then
        ok "$t: the $(wc -l <"$dir/$t-on.answers") answers are the same with sharing on and off"
    else
        bad "$t: answers differ with sharing on (<) and off (>):"
        diff "$dir/$t-on.answers" "$dir/$t-off.answers" | head -20
    fi
done

# ---- a small pool: sessions leave it and come back --------------------------------------
# 51 blocks of f32; each session takes 16 (11 of them the beginning's)
small() {  # small LABEL ARGS...
    L=$1; shift
    : >"$dir/$L.answers"
    start "$L" --kv-type f32 --kv-memory 1M --ram-cache 0 "$@"
    for i in 0 1 2 3 4 5 6 7 8 9; do
        eval "q=\$Q$((i % 6))"
        gen "$L-a$i" "p$i" 64 "$SYS$q (part $i)"
        record "$L" "$L-a$i" "a$i"
    done
    for i in 0 1 2 3 4 5 6 7 8 9; do
        gen "$L-b$i" "p$i" 16 " The end"
        record "$L" "$L-b$i" "b$i"
    done
    status "$L-st"
    stop
    r=$(j get "$dir/$L-st.json" counters.restores)
    [ "$r" -gt 0 ] && ok "$L: sessions moved out and back ($r restores)" ||
        bad "$L: no session came back from disk (restores $r)"
}
small small-on
small small-off --prefix-sharing off
if cmp -s "$dir/small-on.answers" "$dir/small-off.answers"; then
    ok "small pool: the 20 answers are the same with sharing on and off"
else
    bad "small pool: answers differ with sharing on (<) and off (>):"
    diff "$dir/small-on.answers" "$dir/small-off.answers" | head -20
fi

# ---- the per-uid share counts a shared block once ----------------------------------------
# 51 blocks, uid 65534 may hold 25: two of its sessions with the beginning
# hold 14 + 3 blocks with sharing on (both stay), 14 + 14 with it off (the
# first must leave the pool for the second)
quota() {  # quota LABEL ON ARGS...
    L=$1 on=$2; shift 2
    start "$L" --kv-type f32 --kv-memory 1M --ram-cache 0 "$@"
    U="setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups $dir/llamactl --socket $SOCK"
    for i in 0 1; do
        eval "q=\$Q$i"
        $U --json generate --session "v$i" --raw -n 32 --temperature 0 "$SYS$q" \
            >"$dir/$L-v$i.json" 2>"$dir/$L-v$i.err" || bad "$L: uid $NOBODY: $(cat "$dir/$L-v$i.err")"
    done
    $U --json sessions >"$dir/$L-list.json" 2>&1 || bad "$L: sessions: $(cat "$dir/$L-list.json")"
    status "$L-st"
    stop
    loc=$(python3 -c "import json,sys; print(' '.join(s['session'] + ':' + s['location'] for s in sorted(json.load(open(sys.argv[1])), key=lambda s: s['session'])))" "$dir/$L-list.json")
    ev=$(j get "$dir/$L-st.json" counters.evictions_disk)
    if [ "$on" -eq 1 ]; then
        [ "$loc" = "v0:pool v1:pool" ] && [ "$ev" = 0 ] &&
            ok "$L: uid $NOBODY's two sessions fit its share, their common blocks counted once" ||
            bad "$L: uid $NOBODY's sessions: $loc; $ev evictions to disk"
    else
        [ "$loc" = "v0:disk v1:pool" ] && [ "$ev" -ge 1 ] &&
            ok "$L: without sharing the first leaves the pool for the second" ||
            bad "$L: uid $NOBODY's sessions: $loc; $ev evictions to disk"
    fi
}
if [ "$ROOT" -eq 1 ]; then
    quota quota-on 1
    quota quota-off 0 --prefix-sharing off
    [ "$(text quota-on-v0)" = "$(text quota-off-v0)" ] && [ "$(text quota-on-v1)" = "$(text quota-off-v1)" ] ||
        bad "quota: answers differ on and off"
fi

grep -i "error\|refus\|corrupt" "$dir"/llamad-*.log && bad "errors in the logs"
[ "$fail" -eq 0 ] && echo "PASS prefix_sharing"
exit "$fail"
