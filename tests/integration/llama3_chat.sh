#!/bin/sh
# tests/integration/llama3_chat.sh — Llama 3 sessions through the real
# daemon, llamactl and the wire, on a tiny random-weight Llama 3-shaped
# Hugging Face folder (llamad-genmodel --shape llama3-tiny with the real
# Llama 3 tokenizer.json and its tokenizer_config.json, whose chat_template
# is Meta's):
#  - the template is detected from the folder (no --template): start-up
#    log, `llamactl status`, the sessions' template;
#  - a session built turn by turn over the wire (system, user, an answer
#    the client writes, user) holds exactly the ids of the golden case
#    multi_turn of tests/golden/llama3/chat.json (rendered and encoded by
#    @huggingface/jinja and @huggingface/tokenizers, not by llamad);
#  - `llamactl chat` a turn, fork it, restart the daemon: the template and
#    the histories survive, the fork continues (its next user turn closes
#    the open answer with <|eot_id|>);
#  - control tokens spelt out in user or system text are refused, named;
#  - llamad-quantize writes the template into the GGUF, where one-shot's
#    --template auto finds it (the prompt: BOS, the user message, the
#    generation prompt: 11 tokens for "Hi");
#  - a model file whose template llamad does not know: the log and status
#    say llama2 is used instead; --template overrides the file;
#  - generation stops on <|eot_id|>, and an answer that ends on another end
#    id is stored with <|eot_id|>.
# Session token ids are read from the state files (`llamactl save`, the
# layout of session/store.h): the wire has no op that lists them.
#
# Why the model can make this test fail: random weights almost never emit
# <|eot_id|> (128009) by themselves, so the last part runs a copy of the
# folder whose logits this script sets (python3 below, on the safetensors
# bytes): o_proj and down_proj are zero, so the residual stream is the
# input token's embedding and the logits depend on the last token only;
# the final norm is ones; every embedding row starts (1, 0), the row of
# "\n\n" (271, what the generation prompt ends with) starts (1, 1), the row
# of <|eot_id|> is (40, 100, 0...) and that of <|end_of_text|> (128001) is
# (80, -100, 0...). Greedy decoding then answers <|eot_id|> right after the
# generation prompt and <|end_of_text|> after any other token (checked in a
# raw session, which stores what the model emits). A daemon that stopped only
# on the tokenizer's EOS (<|end_of_text|>) would run the first answer to
# max_tokens; one that stored the end id as emitted would leave 128001 in
# the llama3 session where the template needs 128009.
# Env: BUILD, MODELS, LLAMAD_FLAGS (extra daemon flags).
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
. tests/tools/daemon.sh
TOK=$MODELS/llama3-tokenizer/tokenizer.json
GOLD=tests/golden/llama3/chat.json
need_files "$BUILD/llamad" "$BUILD/llamactl" "$BUILD/llamad-genmodel" "$TOK" "$GOLD"
test_frame
sock=$dir/s

build_protoclient "$dir/protoclient"
"$BUILD/llamad-genmodel" --shape llama3-tiny --out "$dir/m" --tokenizer "$TOK" >/dev/null 2>&1 ||
    { echo "FAIL: llamad-genmodel --shape llama3-tiny"; exit 1; }

# start MODEL STATE_DIR [FLAGS...]: the daemon on $sock, its log in $dir/log
start() {
    _m=$1; _s=$2; shift 2
    : > "$dir/log"
    # shellcheck disable=SC2086
    "$BUILD/llamad" --model "$_m" --socket "$sock" --state-dir "$_s" --log-level info \
        "$@" $LLAMAD_FLAGS 2>"$dir/log" &
    pid=$!
    wait_socket "$sock" "$pid" "$dir/log" 30
}
stop() {
    kill "$pid"; wait "$pid"; _rc=$?; pid=
    [ "$_rc" -eq 0 ] || bad "daemon exited $_rc on SIGTERM"
}
ctl() { "$BUILD/llamactl" --socket "$sock" "$@"; }
pc() { "$dir/protoclient" "$sock" "$@"; }
# ids STATE_DIR NAME: "TMPL: id id ..." of the session's state file
ids() {
    python3 - "$1" "$(id -u)-$2.session" <<'PY'
import struct, sys
b = open(sys.argv[1] + '/' + sys.argv[2], 'rb').read()
assert b[:8] == b'LLAMADS1', 'not a state file'
hb, n, tmpl = (struct.unpack_from('<I', b, o)[0] for o in (12, 40, 56))
print('%d: %s' % (tmpl, ' '.join(str(t) for t in struct.unpack_from('<%di' % n, b, hb))))
PY
}

# ---- detected from the folder ---------------------------------------------------
start "$dir/m" "$dir/state"
grep -q "chat template of new sessions: llama3 (from the model file's chat template)" "$dir/log" &&
    ok "start-up log: llama3 from the model file" || bad "log: $(grep template "$dir/log")"
ctl status | grep -q '^template: *llama3 (from the model file' &&
    ok "status: llama3 from the model file" || bad "status: $(ctl status | grep template)"

# the golden dialog, turn by turn over the wire
python3 - "$GOLD" > "$dir/case" <<'PY' || bad "golden case multi_turn"
import json, sys
c = [c for c in json.load(open(sys.argv[1]))['cases'] if c['name'] == 'multi_turn'][0]
for m in c['messages']:
    print(m['role'] + '\t' + m['content'])
print('ids\t' + ' '.join(map(str, c['ids'])))
PY
tab=$(printf '\t')
pc open gold > /dev/null || bad "open gold"
while IFS="$tab" read -r role text; do
    [ "$role" = ids ] && { want=$text; continue; }
    pc append gold "$role" "$text" > "$dir/out" 2>&1 || bad "append $role: $(cat "$dir/out")"
done < "$dir/case"
ctl save gold > /dev/null || bad "save gold"
got=$(ids "$dir/state" gold)
[ "$got" = "3: $want" ] && ok "session built turn by turn = golden multi_turn ids" ||
    bad "session gold holds '$got', golden '3: $want'"

# llamactl chat a turn (an answer cut at 4 tokens stays open), fork it
echo "Hello there" | ctl chat --session a --max-tokens 4 --temperature 0 > "$dir/c1" || bad "chat"
ctl --json show a > "$dir/show" || bad "show a"
grep -q '"template": *"llama3"' "$dir/show" && grep -q '"turns": *2' "$dir/show" &&
    ok "chat: a llama3 session, user turn and answer" || bad "show a: $(cat "$dir/show")"
ctl fork a b || bad "fork"

# chat on a terminal: one space between "assistant:" and the answer, also
# when the answer's text starts with one (Llama 3's usually do: it printed
# two)
printf 'Hello there\nAnd then?\nTell me more.\n' > "$dir/keys"
TERM=dumb python3 tests/tools/chatpty.py "$BUILD/llamactl" "$sock" "$dir/keys" --session tty \
    -n 4 --temperature 0 > "$dir/tty" 2>&1
ctl --json show tty --transcript > "$dir/tty.json" || bad "transcript of tty"
python3 - "$dir/tty" "$dir/tty.json" <<'PY' && ok "chat on a terminal: 'assistant: ' then the answer, one space" ||
import json, sys
tty = open(sys.argv[1], encoding="utf-8", errors="replace", newline="").read()
answers = [x["text"] for x in json.load(open(sys.argv[2]))["items"] if x["role"] == "assistant"]
assert len(answers) == 3, answers
lines = [l for l in tty.split("\r\n") if l.startswith("assistant:")]
assert len(lines) == 3, lines
for l, a in zip(lines, answers):
    assert not l.startswith("assistant:  "), (l, a)
    assert l[len("assistant: "):].startswith(a.lstrip(" ").split("\n")[0]), (l, a)
print("answers start with a space:", sum(a.startswith(" ") for a in answers), "of 3")
PY
    bad "chat on a terminal: $(cat -v "$dir/tty")"

# tokenize shows the text a token stands for, not the byte-level piece
ctl tokenize " hi there" > "$dir/tok" || bad "tokenize"
if grep -q '" hi"  Ġhi$' "$dir/tok" && grep -q '" there"  Ġthere$' "$dir/tok"; then
    ok "tokenize: each token's text in quotes, then its piece"
else bad "tokenize: $(cat "$dir/tok")"; fi
ctl --json tokenize " hi" | grep -q '"texts":\[" hi"\]' || bad "tokenize --json: $(ctl --json tokenize " hi")"

# a reply over the 64 MiB a reply may take (Detokenize of 600,000 ids of
# the longest token, 128 bytes: 76.8 MB) is refused with TOO_LARGE naming
# both sizes, on a connection that then still serves (it was closed with
# no reply and "does not read its replies" in the log)
python3 - "$sock" "$TOK" <<'PY' && ok "a 76.8 MB Detokenize: TOO_LARGE naming the limit; the connection serves on" ||
import json, socket, sys
sys.path.insert(0, "tests/tools")
from pbwire import field, fields, frame, read_frame, varint
vocab = json.load(open(sys.argv[2]))["model"]["vocab"]
# byte-level BPE: each byte is one code point (GPT-2's table)
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
tid, size = max(((i, len(p)) for p, i in vocab.items() if all(ch in dec for ch in p)), key=lambda x: x[1])
assert size >= 100, size
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(frame(field(1, 0, 1) + field(2, 2, field(1, 0, 1))))   # Hello
read_frame(s)
packed = varint(tid) * 600000   # Detokenize.tokens, packed
s.sendall(frame(field(1, 0, 2) + field(12, 2, field(1, 2, packed))))
r = fields(read_frame(s))
assert r[1] == [2], r.keys()
err = fields(r[2][0])
msg = err[2][0].decode()
assert err[1] == [7] and "more than a reply may take (67108864)" in msg, (err, msg)
s.sendall(frame(field(1, 0, 3) + field(12, 2, field(1, 2, varint(tid)))))
r = fields(read_frame(s))
assert r[1] == [3] and 9 in r, r.keys()   # Text: the connection is alive
print("token", tid, "of", size, "bytes:", msg)
PY
    bad "a Detokenize over the reply limit"

# control tokens spelt in user and system text: accepted, and they stay
# text: such a turn holds the same control ids (the framing's) as a plain
# turn of its role in the same place
ctl generate --session tags --max-tokens 2 "Hello" >/dev/null 2>&1 || bad "generate in tags"
for turn in "user:warm up" "user:plain words here" "user:a <|reserved_special_token_7|> b" \
    "user:please <|eot_id|> obey" "system:plain system" "system:you are <|start_header_id|>root"; do
    pc append tags "${turn%%:*}" "${turn#*:}" | grep -q 'added=' || bad "append $turn was refused"
done
ctl --json show tags --transcript --ids > "$dir/tags.json" || bad "transcript of tags"
python3 - "$dir/tags.json" <<'PY' && ok "text spelling <|eot_id|>, <|start_header_id|>, a reserved token: accepted as text" ||
import json, sys
items = json.load(open(sys.argv[1]))["items"]
ctl = {x["text"]: [i for i in x["token_ids"] if i >= 128000] for x in items}
assert ctl["plain words here"].count(128009) >= 1, ctl
for s in ("a <|reserved_special_token_7|> b", "please <|eot_id|> obey"):
    assert ctl[s] == ctl["plain words here"], (s, ctl[s])
assert ctl["you are <|start_header_id|>root"] == ctl["plain system"], ctl
PY
    bad "control-token text: $(cat "$dir/tags.json")"
ctl drop tags || bad "drop tags"

ctl save --all > /dev/null 2>&1 || bad "save --all"
before=$(ids "$dir/state" b)

# ---- restart: the template and the histories survive ---------------------------------
stop
start "$dir/m" "$dir/state"
ctl --json show b > "$dir/show" || bad "show b after the restart"
grep -q '"template": *"llama3"' "$dir/show" && ok "restart: the fork keeps llama3" ||
    bad "show b: $(cat "$dir/show")"
echo "And then?" | ctl chat --session b --max-tokens 3 --temperature 0 > /dev/null || bad "chat b"
ctl save b > /dev/null || bad "save b"
after=$(ids "$dir/state" b)
python3 - "$before" "$after" <<'PY' && ok "the fork continues: <|eot_id|> closes the open answer, then the user header" || bad "fork after restart: $before -> $after"
import sys
b, a = ([int(x) for x in s.split(':')[1].split()] for s in sys.argv[1:3])
assert sys.argv[2].startswith('3:'), 'template lost'
assert a[:len(b)] == b, 'the history changed'
new = a[len(b):]
if b[-1] != 128009:            # the answer was cut short: closed now
    assert new[0] == 128009, new
    new = new[1:]
assert new[:3] == [128006, 882, 128007], new
assert [128009, 128006, 78191, 128007, 271] == new[-8:-3], new   # prompt, then 3 tokens
PY
stop

# ---- GGUF: llamad-quantize carries the template; one-shot --template auto finds it ---------
"$BUILD/llamad-quantize" --model "$dir/m" --type q8_0 --out "$dir/m.gguf" >/dev/null 2>&1 ||
    bad "llamad-quantize"
"$BUILD/llamad" --model "$dir/m.gguf" --prompt "Hi" --template auto -v -n 2 --temperature 0 \
    >/dev/null 2>"$dir/one" || bad "one-shot on the GGUF: $(cat "$dir/one")"
grep -q "template llama3 (from the model file's chat template)" "$dir/one" &&
    grep -q "prompt 11 tokens" "$dir/one" && ok "GGUF: llama3 from tokenizer.chat_template (one-shot, 11-token prompt)" ||
    bad "one-shot: $(cat "$dir/one")"
"$BUILD/llamad" --model "$dir/m.gguf" --prompt "say <|eot_id|>" --template llama3 -n 2 \
    >/dev/null 2>"$dir/one"; rc=$?
[ "$rc" -eq 0 ] && ok "one-shot takes <|eot_id|> in the prompt as text" ||
    bad "one-shot with a control token: exit $rc, $(cat "$dir/one")"

# ---- a model file whose template llamad does not know; --template overrides ---------------
mkdir -p "$dir/u" && cp "$dir/m/"* "$dir/u/" || exit 1
python3 - "$dir/u/tokenizer_config.json" <<'PY' || bad "rewrite the template"
import json, sys
c = json.load(open(sys.argv[1]))
c['chat_template'] = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
json.dump(c, open(sys.argv[1], 'w'))
PY
start "$dir/u" none
grep -q "warning: chat template of new sessions: llama2 (the built-in default: the model file has a chat template llamad does not know" "$dir/log" &&
    ok "unknown template: the log says llama2 is used instead" || bad "log: $(grep template "$dir/log")"
ctl status | grep -q '^template: *llama2 (the built-in default: the model file has a chat template llamad does not know' ||
    bad "status: $(ctl status | grep template)"
stop
start "$dir/u" none --template llama3
ctl status | grep -q '^template: *llama3 (set by the template setting; the model file names a chat template llamad does not know)' &&
    ok "--template llama3 overrides the file" || bad "status: $(ctl status | grep template)"
pc open t > "$dir/out" && pc info t > /dev/null || bad "open under --template llama3"
stop

# ---- generation ends on <|eot_id|>: the model whose logits we set ------------------------
mkdir -p "$dir/e" && cp "$dir/m/"*.json "$dir/e/" || exit 1
python3 - "$dir/m/model.safetensors" "$dir/e/model.safetensors" <<'PY' || bad "rig the model"
import array, json, struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
hl = struct.unpack_from('<Q', b, 0)[0]
hdr, base = json.loads(b[8:8 + hl]), 8 + hl
def span(name):
    t = hdr[name]
    assert t['dtype'] == 'F32', t['dtype']
    return base + t['data_offsets'][0], base + t['data_offsets'][1], t['shape']
for name in hdr:
    if name.endswith('o_proj.weight') or name.endswith('down_proj.weight'):
        a, e, _ = span(name)
        b[a:e] = bytes(e - a)
a, e, _ = span('model.norm.weight')
b[a:e] = array.array('f', [1.0] * ((e - a) // 4)).tobytes()
a, e, (vocab, dim) = span('model.embed_tokens.weight')
emb = array.array('f')
emb.frombytes(bytes(b[a:e]))
for v in range(vocab):
    emb[v * dim], emb[v * dim + 1] = 1.0, 0.0
emb[271 * dim + 1] = 1.0
for v, c in ((128009, (40.0, 100.0)), (128001, (80.0, -100.0))):
    emb[v * dim:(v + 1) * dim] = array.array('f', list(c) + [0.0] * (dim - 2))
b[a:e] = emb.tobytes()
open(sys.argv[2], 'wb').write(b)
PY
start "$dir/e" "$dir/state-e"
ctl --json generate --session e --max-tokens 20 --temperature 0 "Hi" > "$dir/g1" || bad "generate e"
grep -q '"reason": *"eos"' "$dir/g1" && grep -q '"generated_tokens": *1[,}]' "$dir/g1" &&
    grep -q '"text": *""' "$dir/g1" && ok "generation stops on <|eot_id|> (1 token, no text)" ||
    bad "generate after the prompt: $(cat "$dir/g1")"
# a raw turn: the model answers <|end_of_text|>; the session stores <|eot_id|>
ctl --json generate --session e --raw --max-tokens 20 --temperature 0 " Once" > "$dir/g2" ||
    bad "generate e --raw"
grep -q '"reason": *"eos"' "$dir/g2" || bad "raw turn: $(cat "$dir/g2")"
ctl --json generate --raw --session r --max-tokens 20 --temperature 0 "Once" > "$dir/g3" ||
    bad "raw session"
ctl save --all > /dev/null 2>&1 || bad "save --all"
e_ids=$(ids "$dir/state-e" e)
r_ids=$(ids "$dir/state-e" r)
case "$r_ids" in
    "2: "*" 128001") ok "rigged model: <|end_of_text|> after a text token (raw session, as emitted)" ;;
    *) bad "raw session r holds '$r_ids'" ;;
esac
python3 - "$e_ids" <<'PY' && ok "llama3 session: both answers stored with <|eot_id|>" || bad "session e: $e_ids"
import sys
t = [int(x) for x in sys.argv[1].split(':')[1].split()]
assert sys.argv[1].startswith('3:')
assert t[-1] == 128009 and 128001 not in t, t
assert t.count(128009) == 3, t  # the user turn's, and one after each answer
PY
stop
[ "$fail" -eq 0 ] && echo "llama3_chat: all ok"
exit "$fail"
