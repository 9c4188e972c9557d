#!/bin/sh
# tests/integration/summarize_long.sh — `llamactl summarize` of any size:
#  - 3 MB of synthetic stories (three times the daemon's max_text, 1 MiB),
#    -n 16: read whole, sent in pieces that each fit max_text and the
#    context, summarized in rounds (several parts at once), progress on
#    stderr (-v), one summary at the end. Before, round 1's joined summaries
#    were over max_text, both counts became the too-large sentinel and the
#    command ended "the summaries (4294967295 tokens) are no shorter than
#    the text (4294967295 tokens)" after minutes.
#  - 30 MB, -n 4 (not under ASan, where it would take most of the run's
#    time; there the first text is 1.5 MB): the same, with the time and
#    rounds printed.
#  - a --max-tokens so large that each part's summary could be longer than
#    the part: every round at least halves the text and it ends with a
#    summary; before, it failed ("no shorter") or, near the end, went round
#    the 16-round limit with two parts that summarized to their own length.
# stories260K (512-token context). Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame
SOCK=$dir/s
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --state-dir none --log-level warning 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30

# stories FILE BYTES: synthetic text of paragraphs
stories() {
    python3 - "$1" "$2" <<'PY'
import random, sys
random.seed(7)
names = ["Lily", "Tom", "Sue", "Ben", "Max", "Mia"]
things = ["a ball", "a red kite", "a little dog", "a big tree", "a toy car", "a cake"]
out, n, size = [], 0, int(sys.argv[2])
while n < size:
    p = " ".join(f"Once upon a time {random.choice(names)} found {random.choice(things)} in "
                 f"the park. {random.choice(names)} was very happy and they played all day."
                 for _ in range(4))
    out.append(p)
    n += len(p) + 2
open(sys.argv[1], "w").write("\n\n".join(out) + "\n")
PY
}

# summarize WHAT FILE MIN_ROUNDS ARGS...: llamactl -v --json summarize ARGS < FILE;
# ok when it ends with a done line after at least MIN_ROUNDS rounds, with
# progress events and lines on stderr
summarize() {
    _what=$1 _file=$2 _min=$3
    shift 3
    _t0=$(date +%s.%N)
    "$CTL" --socket "$SOCK" -v --json summarize --temperature 0 "$@" <"$_file" >"$dir/out" 2>"$dir/err"
    _rc=$?
    _secs=$(awk -v a="$_t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    _size=$(wc -c <"$_file")
    if res=$(python3 - "$dir/out" "$dir/err" "$_min" <<'PY'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
err = open(sys.argv[2]).read()
prog = [l for l in lines if l.get("event") == "progress"]
done = lines[-1]
assert done.get("event") == "done", done
assert done.get("text"), done
rounds = done.get("rounds", 0)
assert rounds >= int(sys.argv[3]), done
assert prog and max(p["round"] for p in prog) == rounds - 1, prog[-1:]
# the input counted piece by piece: a real count, never the sentinel
assert 0 < done.get("input_tokens", 0) < 2**32 - 1, done
# progress on stderr: each part, and each round's counts
assert re.search(r"round 1: part \d+/\d+: \d+ tokens -> \d+", err), err[:300]
assert re.search(r"round %d done: \d+ tokens -> \d+" % (rounds - 1), err), err[-300:]
print(f"{done['parts']} parts, {rounds} rounds, {done['input_tokens']} input tokens")
PY
    ) && [ "$_rc" -eq 0 ]; then
        ok "$_what: $_size bytes summarized in $_secs s: $res"
    else
        bad "$_what ($_size bytes): exit $_rc: $(tail -c 400 "$dir/out") $(tail -n 3 "$dir/err")"
    fi
}

case $BUILD in
*asan*)
    # under ASan the prefill is ~15 times slower (3 MB: 284 s): 1.5 MB,
    # still over max_text, runs the same code
    stories "$dir/big.txt" 1500000
    summarize "1.5 MB (ASan), -n 16" "$dir/big.txt" 3 -n 16
    echo "skip 30 MB under ASan (the same code as 3 MB, twenty times the time)"
    ;;
*)
    stories "$dir/big.txt" 3000000
    summarize "3 MB, -n 16" "$dir/big.txt" 3 -n 16
    stories "$dir/30mb.txt" 30000000
    summarize "30 MB, -n 4" "$dir/30mb.txt" 3 -n 4
    ;;
esac
head -c 3000 "$dir/big.txt" >"$dir/small.txt"
summarize "3 KB, -n 400 (summaries longer than their parts allowed)" "$dir/small.txt" 5 -n 400
kill "$pid"; wait "$pid"; pid=
[ "$fail" -eq 0 ] && echo "PASS summarize_long" || exit 1
