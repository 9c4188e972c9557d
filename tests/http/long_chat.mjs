// tests/http/long_chat.mjs — conversations through llamad-http that outgrow
// the context, with the official OpenAI and Ollama npm clients, and
// cached_tokens against llamad's own work:
//  - 200 turns through each client, resending the whole history every
//    time as they do, streamed and whole in turn, on stories260K (512-token
//    context): every turn is answered; the prompt the usage reports stays
//    within the context while what was sent grows past it many times;
//  - one message alone larger than the context: a 400 before any body,
//    streamed or not (the SDKs' error classes), naming the message;
//  - cached_tokens (prompt_tokens_details) equal to the prompt tokens less
//    those llamad ran through the model for the request (the growth of its
//    prefilled_tokens counter, max_tokens 1 so no decoding is counted; 0
//    when that is more), for
//    a new conversation, one continued, an edited first turn, a new system
//    prompt, a regenerated answer (fork), and a history past the context
//    (shift).
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { execFileSync } from 'node:child_process';
import { URL_, MODEL, SOCKET, LLAMACTL, ok, bad, check, show, step, summary } from './lib.mjs';

const openai = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 60000 });
const ollama = new Ollama({ host: URL_ });
const CTX = 512;
const TURNS = 200;

// a user message of about 20 tokens that differs from turn to turn
const NAMES = ['Lily', 'Tom', 'Ben', 'Sue', 'Max', 'Anna', 'Tim', 'Mia'];
const ask = (k) => `${NAMES[k % NAMES.length]} went to the park on day ${k} and saw a big ${k % 2 ? 'red' : 'blue'} ball.`;

async function openaiTurn(messages, stream) {
  if (!stream) {
    const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 24, temperature: 0 });
    return { text: r.choices[0].message.content, usage: r.usage, finish: r.choices[0].finish_reason };
  }
  const s = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 24, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  const r = { text: '', usage: null, finish: null };
  for await (const c of s) {
    if (c.usage) r.usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta && ch.delta.content) r.text += ch.delta.content;
      if (ch.finish_reason) r.finish = ch.finish_reason;
    }
  }
  return r;
}

async function ollamaTurn(messages, stream) {
  const p = { model: MODEL, messages, options: { num_predict: 24, temperature: 0 } };
  if (!stream) {
    const r = await ollama.chat({ ...p, stream: false });
    return { text: r.message.content, prompt: r.prompt_eval_count, finish: r.done_reason };
  }
  const r = { text: '', prompt: null, finish: null };
  for await (const c of await ollama.chat({ ...p, stream: true })) {
    r.text += c.message.content;
    if (c.done) { r.prompt = c.prompt_eval_count; r.finish = c.done_reason; }
  }
  return r;
}

// TURNS turns through one client; turn(messages, stream) -> {text, prompt}
async function conversation(name, turn) {
  const messages = [{ role: 'system', content: 'You tell short stories.' }];
  let sent = 0, maxPrompt = 0, answered = 0, fell = 0, last = 0;
  const errors = [];
  for (let k = 0; k < TURNS; k++) {
    messages.push({ role: 'user', content: ask(k) });
    try {
      const r = await turn(messages, k % 2 === 1);
      if (typeof r.text === 'string' && r.prompt > 0 && r.prompt <= CTX && r.finish) answered++;
      else errors.push(`turn ${k + 1}: ${show(r)}`);
      maxPrompt = Math.max(maxPrompt, r.prompt);
      if (r.prompt < last) fell++;   // the oldest exchanges went
      last = r.prompt;
      sent += r.prompt;
      messages.push({ role: 'assistant', content: r.text });
    } catch (e) {
      errors.push(`turn ${k + 1}: ${e.status ?? e.status_code ?? ''} ${e.message}`);
      messages.push({ role: 'assistant', content: 'The end.' });
    }
  }
  check(answered === TURNS && errors.length === 0,
    `${name}: ${TURNS} turns resending the whole history, streamed and whole in turn: all answered`,
    `${answered} answered; ${errors.slice(0, 3).join('; ')}`);
  check(maxPrompt <= CTX && fell >= 3 && messages.length > 300,
    `${name}: the prompt stays within the ${CTX}-token context (at most ${maxPrompt}; it fell ${fell} times ` +
    `as the oldest exchanges went) while the history grew to ${messages.length} messages`,
    `max ${maxPrompt}, fell ${fell}`);
}

await step('openai: 200 turns', () => conversation('openai', async (m, s) => {
  const r = await openaiTurn(m, s);
  return { text: r.text, prompt: r.usage ? r.usage.prompt_tokens : 0, finish: r.finish };
}));
await step('ollama: 200 turns', () => conversation('ollama', ollamaTurn));

// one message larger than the context: refused with its status before any body
const huge = 'Lily and Tom played in the big park with a red ball every day. '.repeat(60);
await step('a message larger than the context', async () => {
  for (const stream of [false, true]) {
    try {
      const r = await openai.chat.completions.create({ model: MODEL, max_tokens: 8, stream,
        messages: [{ role: 'user', content: 'Hello' }, { role: 'assistant', content: 'Hi.' },
          { role: 'user', content: huge }] });
      if (stream) for await (const c of r) void c;
      bad(`openai${stream ? ' streamed' : ''}: a message larger than the context was answered`);
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && /message 3 of 3/.test(e.message) &&
        /context/.test(e.message), `openai${stream ? ' streamed' : ''}: BadRequestError (400) before any ` +
        'body, naming the message and the context', `${e.constructor.name} ${e.status}: ${e.message}`);
    }
    try {
      const r = await ollama.chat({ model: MODEL, stream, messages: [{ role: 'user', content: huge }] });
      if (stream) for await (const c of r) void c;
      bad(`ollama${stream ? ' streamed' : ''}: a message larger than the context was answered`);
    } catch (e) {
      check(e.name === 'ResponseError' && e.status_code === 400 && /message 1 of 1/.test(e.error),
        `ollama${stream ? ' streamed' : ''}: ResponseError 400 before any body, naming the message`,
        `${e.name} ${e.status_code}: ${e.message}`);
    }
  }
});

// llamad's count of tokens run through the model for this uid
function prefilled() {
  const out = execFileSync(LLAMACTL, ['--socket', SOCKET, '--json', 'status'], { encoding: 'utf8' });
  return JSON.parse(out).counters.prefilled_tokens;
}

// one request with max_tokens 1: [prompt tokens, cached tokens, computed by llamad]
async function measured(messages) {
  const before = prefilled();
  const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 1, temperature: 0 });
  const computed = prefilled() - before;
  return [r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens, computed];
}

await step('cached_tokens: what llamad did not compute', async () => {
  const sys = (t) => ({ role: 'system', content: t });
  const u = (t) => ({ role: 'user', content: t });
  const a = (t) => ({ role: 'assistant', content: t });
  const base = [sys('A story for the cached check.'), u('Once upon a time there was a cat'),
    a('The cat was happy.'), u('What did the cat do next?')];
  const more = [...base, a('It ran.'), u('And then what happened?')];
  // a long history: past the context, so that a shift drops its start
  const long = [sys('A long one.')];
  for (let k = 0; k < 30; k++) long.push(u(ask(k)), a('They played all day and were happy.'));
  long.push(u('The end?'));
  const cases = [
    ['a new conversation', base],
    ['the same conversation continued', more],
    ['its first turn edited', [base[0], u('Once upon a time there was a dog'), ...base.slice(2)]],
    ['a new system prompt', [sys('Another story.'), ...base.slice(1)]],
    ['an answer regenerated (fork)', [...base, a('It slept.'), u('And then what happened?')]],
    ['the same request again', more],
    ['a history past the context (shift)', long],
    ['the shifted one continued', [...long, a('Yes.'), u('Really?')]],
  ];
  for (const [what, msgs] of cases) {
    const [prompt, cached, computed] = await measured(msgs);
    // a shift computes kept turns again: then more than the prompt, and none cached
    check(prompt > 0 && prompt <= CTX && cached === Math.max(0, prompt - computed),
      `${what}: cached_tokens ${cached} = ${prompt} prompt tokens - ${computed} llamad computed` +
      (computed > prompt ? ' (some more than once: none cached)' : ''),
      `prompt ${prompt}, cached ${cached}, llamad computed ${computed}`);
  }
});

summary('long_chat.mjs');
