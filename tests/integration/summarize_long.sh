#!/bin/sh
# tests/integration/summarize_long.sh — `llamactl summarize` of a text over
# 2 MiB, twice the daemon's default max_text (1 MiB): it is read whole and
# sent in pieces that each fit max_text (the HelloReply says it) and the
# context, summarized in rounds with progress events, and ends with one
# summary. Before, llamactl sized its Tokenize requests by max_frame (16
# MiB) and the daemon refused the first one ("text is longer than
# max_text"). --max-tokens 4 keeps it short on stories260K (~40 s on two
# cores).
# Env: BUILD, MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame
SOCK=$dir/s
"$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
    --socket "$SOCK" --state-dir none --log-level warning 2>"$dir/llamad.log" &
pid=$!
wait_socket "$SOCK" "$pid" "$dir/llamad.log" 30

python3 - "$dir/big.txt" <<'PY'
import random, sys
random.seed(7)
names = ["Lily", "Tom", "Sue", "Ben", "Max", "Mia"]
things = ["a ball", "a red kite", "a little dog", "a big tree", "a toy car", "a cake"]
out, n = [], 0
while n < 2_200_000:
    p = " ".join(f"Once upon a time {random.choice(names)} found {random.choice(things)} in "
                 f"the park. {random.choice(names)} was very happy and they played all day."
                 for _ in range(4))
    out.append(p)
    n += len(p) + 2
open(sys.argv[1], "w").write("\n\n".join(out) + "\n")
PY
size=$(wc -c < "$dir/big.txt")
"$CTL" --socket "$SOCK" --json summarize -n 4 --temperature 0 < "$dir/big.txt" > "$dir/out" 2>"$dir/err"
rc=$?
python3 - "$dir/out" "$size" <<'PY' && ok "summarize of $size bytes (> 2 MiB, twice max_text): done after rounds of parts" || bad "summarize of $size bytes: rc $rc: $(tail -c 600 "$dir/out") $(tail -n 3 "$dir/err")"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
prog = [l for l in lines if l.get("event") == "progress"]
done = lines[-1]
assert done.get("event") == "done", done
assert done.get("parts", 0) > 100 and done.get("rounds", 0) >= 2, done
assert done.get("text"), done
assert prog and max(p["round"] for p in prog) >= 1, prog[:2]
# the input counted piece by piece (the whole is over max_text): ~0.4 token a byte
assert 0 < done.get("input_tokens", 0) < 2**32 - 1, done
print("parts", done["parts"], "rounds", done["rounds"], "input_tokens", done.get("input_tokens"))
PY
[ "$rc" -eq 0 ] || bad "exit $rc"
kill "$pid"; wait "$pid"; pid=
[ "$fail" -eq 0 ] && echo "PASS summarize_long" || exit 1
