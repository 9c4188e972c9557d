// tests/bench/http_turns.mjs — eight conversations interleaved through the
// OpenAI SDK (turn 1 of each, then turn 2 of each, ...), each resent whole
// with every request as stateless clients do, until each holds about
// TURNS_TOKENS tokens. Prints one JSON line per turn:
// {"conv", "turn", "prompt_tokens", "cached_tokens", "ms"} and, last, the
// per-turn time by prompt length ({"summary": ...}).
// Env: BASE_URL (http://127.0.0.1:PORT/v1), MODEL, CONVS (8), TURNS_TOKENS
// (2000), ANSWER (32 tokens), USER_WORDS (60).
import OpenAI from 'openai';

const base = process.env.BASE_URL;
const model = process.env.MODEL || 'llamad';
const convs = Number(process.env.CONVS || 8);
const target = Number(process.env.TURNS_TOKENS || 2000);
const answer = Number(process.env.ANSWER || 32);
const words = Number(process.env.USER_WORDS || 60);
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 600000 });

// Deterministic English-like user turns, different per conversation and turn.
const vocab = ('the a little girl boy dog cat tree house river garden sun moon star friend mother father ' +
  'happy sad big small red blue green walked ran jumped saw found played laughed went came looked ' +
  'under over near far with and but then because when while before after every day night morning').split(' ');
let seed = 12345;
const rnd = () => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed; };
const userTurn = (c, t) => {
  const w = [`Conversation ${c}, turn ${t}:`];
  for (let i = 0; i < words; i++) w.push(vocab[rnd() % vocab.length]);
  return w.join(' ') + '. What happens next?';
};

const hist = Array.from({ length: convs }, () => []);
const done = new Array(convs).fill(false);
const rows = [];
for (let t = 1; done.includes(false); t++) {
  for (let c = 0; c < convs; c++) {
    if (done[c]) continue;
    hist[c].push({ role: 'user', content: userTurn(c, t) });
    const t0 = performance.now();
    const r = await client.chat.completions.create({ model, messages: hist[c], max_tokens: answer, temperature: 0 });
    const ms = performance.now() - t0;
    const u = r.usage || {};
    const row = { conv: c, turn: t, prompt_tokens: u.prompt_tokens, cached_tokens: u.prompt_tokens_details?.cached_tokens ?? null,
      completion_tokens: u.completion_tokens, ms: Math.round(ms * 10) / 10 };
    rows.push(row);
    console.log(JSON.stringify(row));
    hist[c].push({ role: 'assistant', content: r.choices[0].message.content });
    if ((u.prompt_tokens || 0) + (u.completion_tokens || 0) >= target) done[c] = true;
  }
}
// per-turn time by prompt length: bins of 250 tokens, median
const bins = {};
for (const r of rows) {
  const b = Math.floor((r.prompt_tokens || 0) / 250) * 250;
  (bins[b] ||= []).push(r.ms);
}
const med = (a) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor((s.length - 1) / 2)]; };
const summary = Object.keys(bins).map(Number).sort((a, b) => a - b)
  .map((b) => ({ from: b, to: b + 249, turns: bins[b].length, median_ms: med(bins[b]) }));
console.log(JSON.stringify({ summary, turns: rows.length, total_ms: Math.round(rows.reduce((s, r) => s + r.ms, 0)) }));
