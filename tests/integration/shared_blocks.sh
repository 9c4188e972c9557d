#!/bin/sh
# Common prefixes on disk (stories260K, f16): sessions that begin with one
# system prompt keep its blocks once, in STATE_DIR/blocks; the state files
# hold only the rest. Restored, they continue exactly as sessions saved
# without sharing (version 2 files). A kill between the block files and the
# state file loses no session that was reported saved, and the next start
# removes the blocks nothing refers to. A block file with a flipped byte is
# refused naming the file and the reason: its sessions load without their
# K/V, recompute it, and answer the same. Dropping every session removes
# every block file.
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
need_files "$MODELS/stories260K.bin" "$MODELS/tok512.model"
test_frame
CTL=$BUILD/llamactl
SOCK=$dir/s
log=$dir/llamad.log

start() {  # start STATE_DIR [FLAGS...]
    sd=$1; shift
    rm -f "$SOCK"
    echo "== start $sd $*" >>"$log"
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$SOCK" --state-dir "$sd" --kv-type f16 --threads 1 --save-delay 3600 \
        --log-level debug "$@" 2>>"$log" &  # a later --kv-type wins
    pid=$!
    wait_socket "$SOCK" "$pid" "$log" 30
}
stop() {
    kill -TERM "$pid" && wait "$pid" || bad "llamad exited with $?"
    pid=
}
gen() {  # gen SESSION TEXT [N]: greedy tokens appended to SESSION
    "$CTL" --socket "$SOCK" generate --session "$1" --raw -n "${3:-16}" --temperature 0 "$2"
}
continue_all() {  # continue_all LABEL: $same = sessions continuing as want-*
    same=0
    for s in s1 s2 s3 s4; do
        got=$(gen $s " Then" 12) || bad "$1: $s continues"
        [ "$got" = "$(cat "$dir/want-$s")" ] && same=$((same + 1))
    done
}
nblocks() { ls "$1/blocks" 2>/dev/null | grep -c '\.kvb$'; }
bytes() { cat "$@" 2>/dev/null | wc -c; }
field() {  # field JSON KEY
    printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

SYS="You are a careful storyteller. You tell short stories for small children about animals,\
 parks, toys and friends. Every story is kind, simple and happy, with a little lesson at the\
 end. Use short sentences and easy words. Never use scary things. The children like dogs, cats,\
 birds, balls, trees, the sun and the sea. Now tell the story they ask for."
Q1=" Tell a story about a dog and a ball."
Q2=" Tell a story about a cat in a tree."
Q3=" Tell a story about a bird by the sea."
Q4=" Tell a story about two friends in the park."

# the same four sessions, with sharing (A) and without (B: version 2 files)
for run in A B; do
    flags=
    [ $run = B ] && flags="--prefix-sharing off"
    # shellcheck disable=SC2086
    start "$dir/$run" $flags
    gen s1 "$SYS$Q1" >/dev/null && gen s2 "$SYS$Q2" >/dev/null &&
        gen s3 "$SYS$Q3" >/dev/null && gen s4 "$SYS$Q4" >/dev/null || bad "$run: generations"
    "$CTL" --socket "$SOCK" save --all >/dev/null || bad "$run: save --all"
    stop
done
nA=$(nblocks "$dir/A"); nB=$(nblocks "$dir/B")
fa=$(bytes "$dir"/A/*.session); ba=$(bytes "$dir"/A/blocks/*.kvb); fb=$(bytes "$dir"/B/*.session)
[ "$nB" -eq 0 ] && [ "$nA" -gt 0 ] && ok "with sharing, $nA block files; without, none" ||
    bad "block files: $nA with sharing, $nB without"
[ $((fa + ba)) -lt $((fb * 6 / 10)) ] &&
    ok "disk: $fa + $ba bytes with sharing, $fb without" ||
    bad "disk: $fa + $ba bytes with sharing, $fb without"
cp -r "$dir/A" "$dir/K"; cp -r "$dir/A" "$dir/C"; cp -r "$dir/A" "$dir/D"

# restored, each continues exactly as without sharing
start "$dir/B"
for s in s1 s2 s3 s4; do gen $s " Then" 12 >"$dir/want-$s" || bad "B: $s continues"; done
stop
start "$dir/A"
continue_all A
[ $same -eq 4 ] && ok "restored from block files, 4 sessions continue as version 2 files do" ||
    bad "$same of 4 restored sessions continue as without sharing"
st=$("$CTL" --socket "$SOCK" --json status)
[ "$(field "$st" block_files)" = "$nA" ] && ok "status: $nA block files" || bad "status: $st"
# every session dropped: no block file stays
for s in s1 s2 s3 s4; do "$CTL" --socket "$SOCK" drop $s || bad "drop $s"; done
n=$(nblocks "$dir/A")
[ "$n" -eq 0 ] && ok "dropping every session removed every block file" ||
    bad "$n block files left after every session was dropped"
stop

# a kill between the block files and the state file
start "$dir/K"
gen s1 " Then" 12 >/dev/null || bad "K: s1 grows"
"$CTL" --socket "$SOCK" save s1 >/dev/null || bad "K: save s1"
saved_len=$(field "$("$CTL" --socket "$SOCK" --json show s1)" tokens)
before=$(nblocks "$dir/K")
stop
LLAMAD_TEST_KILL_BETWEEN_WRITES=1 start "$dir/K"
gen s5 "A different opening, long enough to fill a few blocks of its own: the quick brown\
 fox jumps over the lazy dog, and the dog does not mind at all, it just sleeps." >/dev/null ||
    bad "K: s5"
gen s1 " And the next day" 20 >/dev/null || bad "K: s1 grows again"
"$CTL" --socket "$SOCK" save s1 >/dev/null 2>&1
wait "$pid"; rc=$?
pid=
[ $rc -eq 137 ] && ok "killed between the block files and the state file" ||
    bad "llamad exited with $rc, not killed by the hook"
after=$(nblocks "$dir/K")
[ "$after" -gt "$before" ] && ok "the kill left $((after - before)) block files no state file names" ||
    bad "block files: $before before, $after after the kill"
start "$dir/K"
grep -q "removed $((after - before)) shared block file" "$log" &&
    ok "the restart removed them" || bad "the restart did not say it removed $((after - before))"
n=$(nblocks "$dir/K")
[ "$n" -eq "$before" ] && ok "$n block files, as after the last save" || bad "$n block files, $before expected"
len=$(field "$("$CTL" --socket "$SOCK" --json show s1)" tokens)
[ -n "$len" ] && [ "$len" = "$saved_len" ] &&
    ok "s1 is as last reported saved: $len tokens" || bad "s1 has $len tokens, saved $saved_len"
got=$(gen s1 " Then" 12) && [ -n "$got" ] && ok "s1 restores and generates" ||
    bad "s1 after the kill: '$got'"
[ -z "$(ls "$dir/K" | grep s5)" ] && ok "s5, never reported saved, has no state file" ||
    bad "s5 has a state file"
stop

# a block file with a flipped byte: refused, named; the sessions recompute
f=$(ls "$dir/C/blocks" | grep '\.kvb$' | head -1)
python3 - "$dir/C/blocks/$f" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[200] ^= 0x40
open(p, 'wb').write(b)
EOF
start "$dir/C"
continue_all C
[ $same -eq 4 ] && ok "with a corrupt block file, 4 sessions recompute their cache and answer the same" ||
    bad "$same of 4 sessions answer the same with a corrupt block file"
grep "$f" "$log" | grep -q "checksum" && ok "the log names $f and why" ||
    bad "no log line names $f with the reason"
[ -f "$dir/C/blocks/$f.corrupt" ] && ok "the block file was moved to $f.corrupt" ||
    bad "$f was not moved aside"
st=$("$CTL" --socket "$SOCK" --json status)
[ "$(field "$st" block_files_refused)" -ge 1 ] 2>/dev/null && ok "counted: block_files_refused" ||
    bad "status: $st"
"$CTL" --socket "$SOCK" save --all >/dev/null || bad "C: save --all"
[ -f "$dir/C/blocks/$f" ] && ok "the next save wrote $f again" || bad "$f not written again"
stop

# a state file naming a block file that is gone: the same
rm -f "$dir/D/blocks/$f"
start "$dir/D"
got=$(gen s2 " Then" 12) || bad "D: s2 continues"
[ "$got" = "$(cat "$dir/want-s2")" ] && ok "a missing block file: the session recomputes, same answer" ||
    bad "missing block file: '$got'"
stop
# K/V converted from another type is not what this daemon computes: a
# q8_0 session restored into an f16 daemon gives no block to a new session
# with its prompt, saved and restored again neither (version 3 with no
# shared block); the new session answers as a plain f16 daemon does
start "$dir/Q" --kv-type q8_0
gen q "$SYS$Q1" 20 >/dev/null || bad "Q: q8_0 session"
stop
start "$dir/F"   # f16, nothing saved: the reference
want=$(gen c "$SYS$Q1" 40) || bad "F: reference"
stop
for round in converted restored; do
    start "$dir/Q"
    "$CTL" --socket "$SOCK" fork q q2 >/dev/null || bad "Q: fork (restores q)"
    # saved by this daemon: f16, inexact, so the next round restores it
    # without conversion and must still not share it
    "$CTL" --socket "$SOCK" save q >/dev/null || bad "Q: save q"
    got=$("$CTL" --socket "$SOCK" --json generate -s "c-$round" --raw -n 40 --temperature 0 \
        "$SYS$Q1" | tail -1)
    "$CTL" --socket "$SOCK" drop q2 >/dev/null
    "$CTL" --socket "$SOCK" drop "c-$round" >/dev/null
    stop
    [ "$(field "$got" shared_tokens)" = 0 ] &&
        [ "$(printf '%s' "$got" | python3 -c 'import json,sys; print(json.load(sys.stdin)["text"], end="")')" = "$want" ] &&
        ok "$round q8_0 K/V in an f16 daemon: shared with nothing, the answer is f16's" ||
        bad "$round q8_0 K/V shared or changed an answer: $got"
done
[ "$(nblocks "$dir/Q")" -eq 0 ] && ok "saved again without block files (the q8_0 ones removed)" ||
    bad "converted K/V: $(nblocks "$dir/Q") block files"

[ "$fail" -eq 0 ] && echo "PASS shared_blocks"
exit "$fail"
