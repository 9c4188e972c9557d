#!/bin/sh
# tests/bench/http_turns.sh: stateless clients' conversations, llamad-http
# against llama-server (make bench-http-turns; long: not in make bench).
# Eight conversations interleaved (turn 1 of each, then turn 2 of each,
# ...), each resent whole with every request through the npm openai client
# (tests/bench/http_turns.mjs), growing to ~TURNS_TOKENS tokens; 32-token
# greedy answers. The model: the stories110M shape (random weights, f16)
# with a 4,096-token context, as one GGUF file (llamad-quantize) that both
# servers load. Runs llamad + llamad-http; then, when LLAMA_SERVER names a
# llama-server binary (built from llama.cpp's source for this CPU), the
# same against it with one slot (-np 1: each turn of another conversation
# takes the slot) and with eight (-np 8: a slot per conversation). Prints
# one JSON line per turn and a per-length summary per server, and the
# ratios at the longest bin. Env: BUILD, MODELS, THREADS (2), CONVS (8),
# TURNS_TOKENS (2000), LLAMA_SERVER (unset: llamad only).
set -e
BUILD=${BUILD:-build}
MODELS=${MODELS:-../shared/models}
THREADS=${THREADS:-2}
export CONVS=${CONVS:-8} TURNS_TOKENS=${TURNS_TOKENS:-2000}
OUT=$BUILD/bench-models
dir=$(mktemp -d /tmp/llamad-bench-turns.XXXXXX)
pids=
trap 'kill $pids 2>/dev/null || true; rm -rf "$dir"' EXIT
NODEDIR=$BUILD/http-node
sh tests/http/install.sh "$NODEDIR" >/dev/null
cp tests/bench/http_turns.mjs "$NODEDIR/"

# the model: stories110M shape, f16, read with a 4,096-token context (as
# prefix.sh), written as one GGUF file
gguf=$OUT/stories110M-f16-ctx4k.gguf
if [ ! -f "$gguf" ]; then
    . tests/bench/models.sh
    bench_110m_ctx4k
    "$BUILD/llamad-quantize" --model "$ctx4k" --type f16 --out "$gguf" >/dev/null
fi
port() { node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); })'; }
wait_http() {   # URL PID: until it answers
    for i in $(seq 600); do
        curl -sf "$1" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}
run() {   # NAME URL MODEL
    echo "== $1"
    BASE_URL=$2 MODEL=$3 node "$NODEDIR/http_turns.mjs" | tee "$dir/$1.jsonl"
}

# ---- llamad + llamad-http --------------------------------------------------------
P=$(port)
"$BUILD/llamad" --model "$gguf" --socket "$dir/l.sock" --state-dir "$dir/state" --threads "$THREADS" \
    --kv-memory 2G 2>"$dir/llamad.log" &
lp=$!; pids="$pids $lp"
"$BUILD/llamad-http" --socket "$dir/l.sock" --name m --listen "127.0.0.1:$P" -q 2>"$dir/http.log" &
gp=$!; pids="$pids $gp"
wait_http "http://127.0.0.1:$P/v1/models" "$gp"
for i in $(seq 300); do [ -S "$dir/l.sock" ] && break; sleep 0.2; done
run llamad-http "http://127.0.0.1:$P/v1" m
kill $gp $lp; wait $gp $lp 2>/dev/null || true; pids=

# ---- llama-server ------------------------------------------------------------------
if [ -n "$LLAMA_SERVER" ]; then
    for np in 1 8; do
        P=$(port)
        "$LLAMA_SERVER" -m "$gguf" -t "$THREADS" -np $np -c $((np == 1 ? 4096 : 8 * 2304)) \
            --host 127.0.0.1 --port "$P" >"$dir/ls$np.log" 2>&1 &
        sp=$!; pids=$sp
        wait_http "http://127.0.0.1:$P/health" "$sp" || { echo "llama-server did not start:"; tail "$dir/ls$np.log"; exit 1; }
        run "llama-server-np$np" "http://127.0.0.1:$P/v1" m
        kill $sp; wait $sp 2>/dev/null || true; pids=
    done
    "$LLAMA_SERVER" --version 2>&1 | head -2 | sed 's/^/llama-server: /'
fi

# ---- the summary --------------------------------------------------------------------
echo
echo "per-turn time (median ms) by prompt length, $CONVS conversations interleaved, $(nproc) cores"
node -e '
const fs = require("fs"), dir = process.argv[1];
const names = fs.readdirSync(dir).filter((f) => f.endsWith(".jsonl")).map((f) => f.slice(0, -6)).sort();
const sums = {};
for (const n of names) {
  const lines = fs.readFileSync(`${dir}/${n}.jsonl`, "utf8").trim().split("\n");
  sums[n] = JSON.parse(lines[lines.length - 1]).summary;
}
const bins = [...new Set(Object.values(sums).flat().map((b) => b.from))].sort((a, b) => a - b);
console.log(["prompt tokens"].concat(names).map((s) => s.padEnd(22)).join(""));
for (const b of bins) {
  const row = [`${b}-${b + 249}`];
  for (const n of names) { const x = sums[n].find((s) => s.from === b); row.push(x ? `${x.median_ms} (${x.turns})` : "-"); }
  console.log(row.map((s) => String(s).padEnd(22)).join(""));
}
const last = bins[bins.length - 1], l = sums["llamad-http"]?.find((s) => s.from === last);
for (const n of names) if (n !== "llamad-http") {
  const x = sums[n].find((s) => s.from === last);
  if (l && x) console.log(`at ${last}-${last + 249} tokens: llamad-http / ${n} = ${(l.median_ms / x.median_ms).toFixed(3)}`);
}' "$dir"
