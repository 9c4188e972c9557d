#!/bin/sh
# tests/integration/llamactl_json_golden.sh — every --json output of
# llamactl, byte for byte. Each case runs one llamactl command (greedy
# sampling) and compares its stdout, followed by a line "# exit N", with
# tests/golden/llamactl_json/CASE.json:
#  - against a real daemon on stories260K: generate, chat piped, summarize,
#    sessions, show (info, --transcript, --last, --from, --ids), fork, drop,
#    save, tokenize, status; stop reasons max_tokens, stop, context_full;
#    errors of every kind (usage, connect, daemon codes, too large, local);
#    then the same sessions read back from disk after a restart;
#  - against a fake daemon (tests/tools/fake_llamad.py) for replies a real
#    one does not give: unset fields, enum values llamactl does not know,
#    text that is not UTF-8, timings to round, a transcript in two pages,
#    an unexpected reply, a connection closed during the handshake.
# Before the comparison only what varies between runs or machines is masked,
# its key and place kept and its form checked: timings and uptime (a number
# with at most 3 decimals) become <ms>; last use, rss, owner uid, the
# saved sessions' bytes on disk (an idle save may or may not have run), the
# forward passes (fair_share cuts steps by their measured time) <int>; a
# latency histogram's bucket counts <counts> and sum <num>; the
# backend's description <str>; the temporary folder $DIR, the models' folder
# $MODELS. A session list is sorted by name (the daemon's order is its hash
# table's). Every golden file must be produced by a case.
# GOLDEN_UPDATE=1 writes the golden files instead of comparing (review the
# diff before committing them). Under a sanitizer build (BUILD=build-asan)
# a report on llamactl's stderr fails the case.
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
llamactl_frame
GOLD=tests/golden/llamactl_json
sock=$dir/s
mkdir -p "$dir/got"
n_cases=0

cat > "$dir/mask.py" <<'PY'
import json, re, sys
folder, models, opts = sys.argv[1], sys.argv[2], sys.argv[3:]
text = sys.stdin.read()
if "sort" in opts and text.startswith("["):
    # a session list: its objects ordered by name, each kept byte for byte
    dec, i, items = json.JSONDecoder(), 1, []
    while text[i] != "]":
        obj, j = dec.raw_decode(text, i)
        items.append((obj.get("session") or "", text[i:j]))
        i = j + (text[j] == ",")
    text = "[" + ",".join(t for _, t in sorted(items)) + text[i:]
text = text.replace(folder, "$DIR").replace(models, "$MODELS")
MS = r"-?[0-9]+(?:\.[0-9]{1,3})?"   # rounded to 3 decimals
INT = r"-?[0-9]+"
NUM = r"-?[0-9.]+(?:[eE][-+]?[0-9]+)?"
STR = r'"(?:[^"\\]|\\.)*"'
VARY = (("uptime_s", MS, "<ms>"), ("prefill_ms", MS, "<ms>"), ("generate_ms", MS, "<ms>"),
        ("last_use_ms", INT, "<int>"), ("rss_bytes", INT, "<int>"), ("owner_uid", INT, "<int>"),
        # which sessions an idle save has written yet varies, and how the
        # steps were cut (fair_share times them)
        ("disk_bytes", INT, "<int>"), ("forward_passes", INT, "<int>"),
        ("backend", STR, "<str>"),
        # status's latency histograms: which bucket a time falls in varies
        ("counts", r"\[[0-9,]*\]", "<counts>"), ("sum", NUM, "<num>"))
for key, form, mark in () if "exact" in opts else VARY:
    text = re.sub('"%s":%s(?=[,}])' % (key, form), '"%s":%s' % (key, mark), text)
sys.stdout.write(text)
PY

# golden [--sort] [--exact] CASE ARGS...: llamactl ARGS (stdin: the
# caller's), its masked stdout and exit status against $GOLD/CASE.json;
# --sort: a session list, sorted; --exact: only the folders masked (a fake
# daemon's numbers do not vary)
golden() {
    opts=
    for _o in sort exact; do
        [ "$1" = "--$_o" ] && { opts="$opts $_o"; shift; }
    done
    name=$1; shift
    n_cases=$((n_cases + 1))
    "$CTL" "$@" >"$dir/raw" 2>"$dir/err"; rc=$?
    # shellcheck disable=SC2086  # $opts: words
    { python3 "$dir/mask.py" "$dir" "$MODELS" $opts <"$dir/raw" || echo "# mask failed"
      echo "# exit $rc"; } >"$dir/got/$name.json"
    # a sanitizer build (BUILD=build-asan) reports on stderr
    grep -q "Sanitizer\|runtime error:" "$dir/err" && bad "$name (llamactl $*): $(cat "$dir/err")"
    if [ -n "$GOLDEN_UPDATE" ]; then
        mkdir -p "$GOLD" && cp "$dir/got/$name.json" "$GOLD/$name.json"
    elif ! cmp -s "$GOLD/$name.json" "$dir/got/$name.json"; then
        bad "$name (llamactl $*) differs from $GOLD/$name.json:"
        diff "$GOLD/$name.json" "$dir/got/$name.json" | head -20
    fi
}
# j CASE ARGS...: golden CASE with the daemon's socket and --json
j() { _n=$1; shift; golden "$_n" --socket "$sock" --json "$@"; }
js() { _n=$1; shift; golden --sort "$_n" --socket "$sock" --json "$@"; }

start() {
    "$BUILD/llamad" --model "$MODELS/stories260K.bin" --tokenizer "$MODELS/tok512.model" \
        --socket "$sock" --state-dir "$dir/state" --log-level warning --device cpu \
        --threads 1 --kv-memory 16M --kv-type f32 --ram-cache 16M --save-delay 86400 \
        --max-frame 65536 --max-text 32768 2>>"$dir/log" &
    pid=$!
    wait_socket "$sock" "$pid" "$dir/log"
}

# inputs (files, not pipes: a case in a pipeline would run in a subshell)
echo "Hi" >"$dir/hi"
echo "And then?" >"$dir/then"
echo "Tom has a red ball. He plays with it every day." >"$dir/short.txt"
printf 'A "quote" \\ and\ttab\nnew line \303\251 \342\230\203' >"$dir/odd.txt"
for i in $(seq 1 60); do
    echo "Lily and Ben went to the park. They played on the swings and saw a big dog. The dog was friendly and they were happy."
    echo
done >"$dir/long.txt"
head -c 40000 /dev/zero | tr '\0' a >"$dir/40k"
head -c 70000 /dev/zero | tr '\0' a >"$dir/70k"
head -c 2400 "$dir/long.txt" >"$dir/toolong"

# ---- a real daemon ------------------------------------------------------------
start
j status-fresh status </dev/null
js sessions-empty sessions </dev/null
j generate-raw generate --raw --session g --temperature 0 -n 8 "Once upon a time" </dev/null
j generate-continue generate --session g --temperature 0 -n 4 </dev/null
j generate-stop generate --raw --session st --temperature 0 -n 60 --stop " park" \
    "Once upon a time" </dev/null
j generate-context-full generate --raw --session full --temperature 0 -n 600 \
    "Once upon a time" </dev/null
j chat-system chat --session c --system "You are a kind bot." -n 6 --temperature 0 <"$dir/hi"
j chat-again chat --session c -n 6 --temperature 0 <"$dir/then"
j chat-policy-error chat --session ce --context-policy error -n 3 --temperature 0 <"$dir/hi"
j tokenize-bos tokenize --bos "Hi there" </dev/null
j tokenize-stdin tokenize - <"$dir/odd.txt"
j tokenize-empty tokenize "" </dev/null
j show-raw show g </dev/null
j show-chat show c </dev/null
j show-full show full </dev/null
j transcript show g --transcript </dev/null
j transcript-chat show c --transcript </dev/null
j transcript-last-ids show c --last 1 --ids </dev/null
j transcript-from show c --from 1 </dev/null
j transcript-from-end show c --from 9 </dev/null
j fork fork g g2 </dev/null
js sessions sessions </dev/null
j save-one save g </dev/null
j save-all save --all </dev/null
j drop drop g2 </dev/null

# errors
j error-drop-unknown drop g2 </dev/null
j error-fork-exists fork g c </dev/null
j error-show-unknown show nosuch </dev/null
j error-transcript-unknown show nosuch --transcript </dev/null
j error-bad-id generate --session 'bad id' x </dev/null
j error-too-large-daemon generate --session big - <"$dir/40k"
j error-too-large-client generate --session big2 - <"$dir/70k"
j error-context-full generate --session cf --temperature 0 - <"$dir/toolong"
j error-template chat --session l3 --template llama3 -n 3 <"$dir/hi"
j error-usage-range generate --max-tokens 0 x </dev/null
j error-usage-option status --bogus </dev/null
j error-usage-missing show </dev/null
j error-usage-command frobnicate </dev/null
golden error-usage-no-command --socket "$sock" --json </dev/null
j error-usage-chat-empty chat --session c </dev/null
golden error-connect --socket "$dir/none.sock" --json status </dev/null
golden error-connect-after --json status --socket "$dir/none.sock" </dev/null
j error-local-no-room summarize --session full --max-tokens 20 <"$dir/long.txt"

j summarize summarize --temperature 0 --max-tokens 20 <"$dir/long.txt"
j summarize-session summarize --session sum --temperature 0 --max-tokens 10 <"$dir/short.txt"
j status-after status </dev/null

# throw-away sessions last: they are dropped when their connection closes,
# which the daemon may see after the next command started
j generate-ephemeral generate --temperature 0 -n 5 "Hello" </dev/null
j chat-ephemeral chat -n 4 --temperature 0 <"$dir/hi"

# ---- the sessions again, from the state directory -------------------------------
kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"
start
js disk-sessions sessions </dev/null
j disk-show show g </dev/null
j disk-transcript show g --transcript --ids </dev/null
j disk-status status </dev/null
kill "$pid"; wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || bad "daemon exited $rc on SIGTERM"

# ---- a fake daemon ------------------------------------------------------------------
python3 tests/tools/fake_llamad.py "$dir" 2>"$dir/fake.log" &
pids=$!
i=0
while [ ! -e "$dir/fake.ready" ]; do
    i=$((i + 1))
    [ "$i" -le 100 ] && kill -0 "$pids" 2>/dev/null || { bad "the fake daemon did not start: $(cat "$dir/fake.log")"; exit 1; }
    sleep 0.1
done
f() { _n=$1; shift; golden --exact "$_n" --socket "$dir/fake.sock" --json "$@"; }
f fake-status status </dev/null
f fake-sessions sessions </dev/null
f fake-show-odd show odd </dev/null
f fake-show-empty show empty </dev/null
f fake-generate-odd generate --session g1 x </dev/null
f fake-generate-empty generate --session g2 x </dev/null
f fake-generate-cancelled generate --session g3 x </dev/null
f fake-generate-unknown-reason generate --session g4 x </dev/null
f fake-generate-error generate --session e1 x </dev/null
f fake-generate-unknown-error generate --session e2 x </dev/null
f fake-chat chat --session g1 <"$dir/hi"
f fake-transcript-pages show t --transcript </dev/null
f fake-transcript-empty show u --transcript </dev/null
f fake-tokenize tokenize x </dev/null
f fake-save save --all </dev/null
f fake-fork fork a b </dev/null
f fake-drop drop a </dev/null
golden --exact fake-unexpected-reply --socket "$dir/reply.sock" --json status </dev/null
golden --exact fake-closed --socket "$dir/close.sock" --json status </dev/null

# ---- every golden file is a case's ----------------------------------------------
for g in "$GOLD"/*.json; do
    [ -e "$dir/got/${g##*/}" ] || bad "$g: no case produces it (remove it, or restore its case)"
done
[ -n "$GOLDEN_UPDATE" ] && echo "wrote $n_cases golden files to $GOLD"
[ "$fail" -eq 0 ] && echo "ok   $n_cases --json outputs equal their golden files"
exit "$fail"
