#!/bin/sh
# tests/golden/cli.sh — llamad's command line (daemon/main.c): --help covers
# every long option the source defines, bad values exit 2 with a message, a
# missing model exits 1 naming it, --stop, --seed, --prompt - (stdin).
# Env: BUILD (build folder), MODELS.
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
LLAMAD=$BUILD/llamad
SRC=daemon/main.c
BIN=$MODELS/stories260K.bin
TOK=$MODELS/tok512.model
. tests/tools/daemon.sh
need_files "$LLAMAD" "$SRC" "$BIN" "$TOK"
test_frame

# ---- --help mentions every long option of daemon/main.c -------------------
# The names are taken from the settings table of daemon/config.c (every
# config key is a flag: max_tokens -> --max-tokens) and from the one-shot
# flags main.c compares by name (!strcmp(name, "echo")).
opts=$( (sed -n 's/^[[:space:]]*{[[:space:]]*"\([a-z][a-z0-9_]*\)",[[:space:]]*K_.*/\1/p' daemon/config.c | tr _ -;
        sed -n 's/.*!strcmp(name, "\([a-z][a-z-]*\)").*/\1/p' "$SRC") | sort -u)
nopts=$(printf '%s\n' "$opts" | grep -c .)
[ "$nopts" -ge 15 ] || bad "found only $nopts long options in $SRC: the extraction is broken"
"$LLAMAD" --help >"$dir/help" 2>"$dir/err"; rc=$?
[ "$rc" -eq 0 ] || bad "--help exited $rc"
[ -s "$dir/err" ] && bad "--help wrote to stderr"
for o in $opts; do
    grep -Eq -- "--$o([^a-z0-9-]|\$)" "$dir/help" || bad "--help does not mention --$o"
done
"$LLAMAD" -h >"$dir/h" 2>&1 && cmp -s "$dir/h" "$dir/help" || bad "-h differs from --help"
"$LLAMAD" --version >"$dir/v" 2>&1 || bad "--version failed"
grep -q '^llamad [0-9]' "$dir/v" || bad "--version printed: $(cat "$dir/v")"
echo "ok   --help lists all $nopts long options"
# --tokenizer names every kind of file it reads (it said "SentencePiece
# tokenizer.model" only)
for k in tokenizer.model tokenizer.json tokenizer.bin GGUF; do
    grep -E -- "--tokenizer " "$dir/help" | grep -q "$k" || bad "--help: --tokenizer does not name $k"
done

# ---- usage errors: exit 2, a message on stderr, nothing on stdout -----------
usage_err() {  # expected-substring args...
    want=$1; shift
    "$LLAMAD" "$@" >"$dir/out" 2>"$dir/err" </dev/null; rc=$?
    if [ "$rc" -ne 2 ]; then
        bad "llamad $*: exit $rc, expected 2"
    elif ! grep -q -e "$want" "$dir/err"; then
        bad "llamad $*: stderr lacks '$want': $(cat "$dir/err")"
    elif [ -s "$dir/out" ]; then
        bad "llamad $*: wrote to stdout"
    fi
}
M="--model $BIN --tokenizer $TOK"
usage_err "max-tokens"        $M --prompt hi --max-tokens abc
usage_err "max-tokens"        $M --prompt hi --max-tokens 0
usage_err "max-tokens"        $M --prompt hi --max-tokens -5
usage_err "max-tokens"        $M --prompt hi --max-tokens 12x
usage_err "max-tokens"        $M --prompt hi --max-tokens 99999999999999999999
usage_err "from 0 to 1024"    $M --prompt hi --threads -1
usage_err "from 0 to 1024"    $M --prompt hi --threads 1025
usage_err "minimum is 1M"     $M --prompt hi --kv-memory 1
usage_err "minimum is 1M"     $M --prompt hi --kv-memory 400K
usage_err "such as 512M"      $M --prompt hi --kv-memory lots
usage_err "from 0 to 100"     $M --prompt hi --temperature 101
usage_err "temperature"       $M --prompt hi --temperature warm
usage_err "temperature"       $M --prompt hi --temperature nan
usage_err "temperature"       $M --prompt hi --temperature inf
usage_err "temperature"       $M --prompt hi --temperature -1
usage_err "top-k"             $M --prompt hi --top-k -1
usage_err "top-p"             $M --prompt hi --top-p 1.5
usage_err "top-p"             $M --prompt hi --top-p 0
usage_err "min-p"             $M --prompt hi --min-p 1
usage_err "repeat"            $M --prompt hi --repeat-penalty 0
usage_err "repeat-last-n"     $M --prompt hi --repeat-last-n -2
usage_err "presence"          $M --prompt hi --presence-penalty 11
usage_err "frequency"         $M --prompt hi --frequency-penalty x
usage_err "template"          $M --prompt hi --template chatml
usage_err "seed"              $M --prompt hi --seed -1
usage_err "seed"              $M --prompt hi --seed 0x10
usage_err "bogus"             $M --prompt hi --bogus
usage_err "unexpected"        $M --prompt hi stray
usage_err "model"             --prompt hi
usage_err "need --prompt"     $M --echo
usage_err "need --prompt"     $M --seed 3
usage_err "system"            $M --prompt hi --system "be brief"
usage_err "stop"              $M --prompt hi --stop a --stop b --stop c --stop d --stop e \
    --stop f --stop g --stop h --stop i --stop j --stop k --stop l --stop m --stop n \
    --stop o --stop p --stop q
echo "ok   usage errors exit 2"

# ---- a missing model: exit 1, the file named ---------------------------------
nomodel=$dir/no/such/model.bin
"$LLAMAD" --model "$nomodel" --prompt hi >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 1 ] || bad "missing model: exit $rc, expected 1"
grep -qF "$nomodel" "$dir/err" || bad "missing model: stderr does not name it: $(cat "$dir/err")"
# a model whose default tokenizer is the wrong one: exit 1, tokenizer named
"$LLAMAD" --model "$BIN" --prompt hi >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 1 ] || bad "wrong tokenizer: exit $rc, expected 1"
grep -q "tokenizer.model" "$dir/err" && grep -q "found beside the model" "$dir/err" &&
    grep -q -- "--tokenizer PATH" "$dir/err" || bad "wrong tokenizer not named, or no fix: $(cat "$dir/err")"
# a text file as the model: the formats are listed
echo "not a model" > "$dir/notes.txt"
"$LLAMAD" --model "$dir/notes.txt" --prompt hi >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "GGUF files, Hugging Face folders" "$dir/err" ||
    bad "a text file as the model: exit $rc: $(cat "$dir/err")"
# ... and as the tokenizer
"$LLAMAD" --model "$BIN" --tokenizer "$dir/notes.txt" --prompt hi >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "not a tokenizer this llamad reads" "$dir/err" ||
    bad "a text file as the tokenizer: exit $rc: $(cat "$dir/err")"
echo "ok   missing model exits 1; wrong files name the fix"

# ---- llama2.c's own tokenizer.bin (run.c's -z tok512.bin) ------------------------
GOLD=${SHARED:-../shared}/reference/stories260K_greedy.txt
want=$(awk '/^--- stdout ---$/ { on = 1; next } on' "$GOLD" | head -1)
got=$("$LLAMAD" --model "$BIN" --tokenizer "$MODELS/tok512.bin" --prompt "Once upon a time" \
      --temperature 0 --max-tokens 30 --echo 2>"$dir/err")
case $want in
    "$got"*) echo "ok   --tokenizer tok512.bin (llama2.c format): the golden text" ;;
    *) bad "tok512.bin: '$got' is not the golden start '$want': $(cat "$dir/err")" ;;
esac

# ---- socket problems are found before the model loads ------------------------------
long=$dir/$(printf 'x%.0s' $(seq 120))/s.sock
"$LLAMAD" --model "$dir/no/such/model.bin" --socket "$long" >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "at most 107" "$dir/err" && ! grep -q "loading" "$dir/err" ||
    bad "a socket path too long: exit $rc: $(cat "$dir/err")"
echo "plain file" > "$dir/file.sock"
"$LLAMAD" --model "$dir/no/such/model.bin" --socket "$dir/file.sock" >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 1 ] && grep -q "not a socket" "$dir/err" || bad "a file at the socket path: $(cat "$dir/err")"
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
    # a user without XDG_RUNTIME_DIR gets the system path, which it cannot use
    setpriv --reuid=65534 --regid=65534 --clear-groups env -u XDG_RUNTIME_DIR -u LLAMAD_SOCKET \
        "$LLAMAD" --model /no/such/model.bin >"$dir/out" 2>"$dir/err"; rc=$?
    [ "$rc" -eq 1 ] && grep -q "XDG_RUNTIME_DIR" "$dir/err" && grep -q -- "--socket PATH" "$dir/err" ||
        bad "no XDG_RUNTIME_DIR: exit $rc: $(cat "$dir/err")"
fi
echo "ok   socket problems are said before the model loads, with the fix"

# ---- --print-config: the socket and state directory it would use --------------------
"$LLAMAD" --model "$BIN" --print-config >"$dir/out" 2>&1 || bad "--print-config failed"
grep -q "^# socket = .*(unset: .*llamad.sock here)" "$dir/out" &&
    grep -q "^# state_dir = .*(unset: .* here)" "$dir/out" && echo "ok   --print-config names the socket and state dir used" ||
    bad "--print-config: $(cat "$dir/out")"
# the state directory by hand, root included, is the user's own; the
# service's only with systemd's STATE_DIRECTORY (root's was /var/lib/llamad)
env -u XDG_STATE_HOME -u STATE_DIRECTORY HOME="$dir/home" "$LLAMAD" --model "$BIN" --print-config \
    >"$dir/out" 2>&1
grep -q "^# state_dir = .*(unset: $dir/home/.local/state/llamad here)" "$dir/out" &&
    echo "ok   the default state dir is the user's own ($(id -un))" ||
    bad "default state dir: $(grep state_dir "$dir/out")"
STATE_DIRECTORY=/srv/x:/srv/y "$LLAMAD" --model "$BIN" --print-config 2>&1 |
    grep -q "^# state_dir = .*(unset: /srv/x here)" || bad "STATE_DIRECTORY is not the default state dir"

run() {  # args... -> stdout in $dir/out; fails the test on a non-zero exit
    "$LLAMAD" $M "$@" >"$dir/out" 2>"$dir/err" || bad "llamad $*: exit $?: $(cat "$dir/err")"
}

# ---- --stop ------------------------------------------------------------------
# greedy: "Once upon a time, there was a little girl named Lily. ..."
run --prompt "Once upon a time" --temperature 0 --max-tokens 60 --stop " named"
printf ', there was a little girl\n' | cmp -s - "$dir/out" || bad "--stop: got '$(cat "$dir/out")'"
run --prompt "Once upon a time" --temperature 0 --max-tokens 60 --stop " named" --echo
printf 'Once upon a time, there was a little girl\n' | cmp -s - "$dir/out" ||
    bad "--stop --echo: got '$(cat "$dir/out")'"
run --prompt "Once upon a time" --temperature 0 --max-tokens 60 --stop "girl" --stop "was"
printf ', there \n' | cmp -s - "$dir/out" || bad "two --stop: got '$(cat "$dir/out")'"
run --prompt "Once upon a time" --temperature 0 --max-tokens 60 --stop "Lily."
printf ', there was a little girl named \n' | cmp -s - "$dir/out" ||
    bad "--stop 'Lily.': got '$(cat "$dir/out")'"
run --prompt "Once upon a time" --temperature 0 --max-tokens 30
cp "$dir/out" "$dir/plain"
run --prompt "Once upon a time" --temperature 0 --max-tokens 30 --stop "zebra"
cmp -s "$dir/plain" "$dir/out" || bad "a stop string that never occurs changed the output"
echo "ok   --stop"

# ---- --seed ------------------------------------------------------------------
S="--prompt Once --temperature 1 --top-k 0 --top-p 1 --min-p 0 --max-tokens 60"
run $S --seed 42;  cp "$dir/out" "$dir/s42a"
run $S --seed 42;  cp "$dir/out" "$dir/s42b"
run $S --seed 43;  cp "$dir/out" "$dir/s43"
run $S --seed 7;   cp "$dir/out" "$dir/s7"
cmp -s "$dir/s42a" "$dir/s42b" || bad "--seed 42 twice gave different output"
[ "$(wc -c <"$dir/s42a")" -gt 20 ] || bad "--seed 42: output too short: $(cat "$dir/s42a")"
cmp -s "$dir/s42a" "$dir/s43" && bad "--seed 42 and --seed 43 gave the same output"
cmp -s "$dir/s43" "$dir/s7" && bad "--seed 43 and --seed 7 gave the same output"
# greedy ignores the seed
run --prompt Once --temperature 0 --max-tokens 30 --seed 1; cp "$dir/out" "$dir/g1"
run --prompt Once --temperature 0 --max-tokens 30 --seed 2
cmp -s "$dir/g1" "$dir/out" || bad "greedy output depends on --seed"
echo "ok   --seed"

# ---- --prompt - reads stdin ----------------------------------------------------
run --prompt "Once upon a time" --temperature 0 --max-tokens 40 --echo
cp "$dir/out" "$dir/arg"
printf 'Once upon a time' | "$LLAMAD" $M --prompt - --temperature 0 --max-tokens 40 --echo \
    >"$dir/out" 2>"$dir/err" || bad "--prompt -: exit $?: $(cat "$dir/err")"
cmp -s "$dir/arg" "$dir/out" || { bad "--prompt - differs from --prompt TEXT"; diff "$dir/arg" "$dir/out"; }
# a stdin prompt longer than the reader's first 4096-byte buffer that is
# still a short token sequence (tok512 collapses runs of spaces): echoed whole
awk 'BEGIN { printf "Once"; for (i = 0; i < 5000; i++) printf " "; printf "upon a time" }' >"$dir/long"
"$LLAMAD" $M -p - --temperature 0 --max-tokens 5 --echo <"$dir/long" >"$dir/out" 2>"$dir/err" ||
    bad "5 KB stdin prompt: exit $?: $(cat "$dir/err")"
head -c "$(wc -c <"$dir/long")" "$dir/out" | cmp -s - "$dir/long" || bad "5 KB stdin prompt not echoed whole"
[ "$(wc -c <"$dir/out")" -gt "$(wc -c <"$dir/long")" ] || bad "5 KB stdin prompt: nothing generated"
# more tokens than the 512-token context: exit 2 naming the context
awk 'BEGIN { for (i = 0; i < 600; i++) printf "Once upon a time. " }' >"$dir/long"
"$LLAMAD" $M -p - --temperature 0 --max-tokens 5 <"$dir/long" >"$dir/out" 2>"$dir/err"; rc=$?
[ "$rc" -eq 2 ] || bad "over-long stdin prompt: exit $rc, expected 2"
grep -q "context" "$dir/err" || bad "over-long prompt refused without naming the context: $(cat "$dir/err")"
echo "ok   --prompt -"

[ "$fail" -eq 0 ] && echo "cli: all ok"
exit $fail
