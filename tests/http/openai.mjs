// tests/http/openai.mjs — llamad-http through the official OpenAI SDK
// (npm openai, pinned in package-lock.json): chat and text completions,
// streamed and not; usage; max_tokens / max_completion_tokens; greedy and
// seeded sampling; stop strings; a conversation resent statelessly
// (continued: cached tokens; regenerated: forked; continued after llamad
// lost the session, by llamactl drop); models (list, retrieve, the paths
// without /v1 and with a trailing slash); the errors the
// SDK maps to its classes; a stream aborted mid-way cancels llamad's
// generation. Prints ok/FAIL lines; exits 1 on any failure.
import OpenAI from 'openai';
import { URL_, MODEL, SLOW_MODEL, SLOW_SOCKET, SOCKET, LLAMACTL, ok, bad, check, show, step, summary,
  metric, sessions, dropAll, sleep } from './lib.mjs';

const client = new OpenAI({ baseURL: `${URL_}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 30000 });
const user = (content) => ({ role: 'user', content });

// A streamed chat completion: its text, pieces, finish reason and usage.
async function streamChat(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const r = { text: '', pieces: 0, finish: null, usage: null, chunks: 0, roleFirst: null, ids: new Set() };
  for await (const c of stream) {
    r.chunks++;
    r.ids.add(c.id);
    if (c.usage) r.usage = c.usage;
    for (const ch of c.choices) {
      if (r.roleFirst === null && ch.delta) r.roleFirst = ch.delta.role ?? '';
      if (ch.delta && ch.delta.content) { r.text += ch.delta.content; r.pieces++; }
      if (ch.finish_reason) r.finish = ch.finish_reason;
    }
  }
  return r;
}

function usageAddsUp(u) {
  return u && u.prompt_tokens > 0 && u.completion_tokens > 0 &&
    u.total_tokens === u.prompt_tokens + u.completion_tokens;
}

await step('chat, not streamed', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [user('Once upon a time')],
    max_tokens: 12, temperature: 0 });
  const c = r.choices[0];
  check(r.object === 'chat.completion' && r.model === MODEL && r.choices.length === 1 &&
    c.message.role === 'assistant' && typeof c.message.content === 'string' && c.message.content.length > 0,
  'chat.completions.create: one assistant message', show(r));
  check(c.finish_reason === 'length' && r.usage.completion_tokens === 12 && usageAddsUp(r.usage),
    'max_tokens 12: finish_reason length, 12 completion tokens, total = prompt + completion', show(r.usage));

  const s = await streamChat({ model: MODEL, messages: [user('Once upon a time')], max_tokens: 12,
    temperature: 0, stream_options: { include_usage: true } });
  check(s.text === c.message.content, 'streamed at temperature 0: the same text as not streamed',
    `${show(s.text)} vs ${show(c.message.content)}`);
  check(s.roleFirst === 'assistant' && s.ids.size === 1 && s.finish === 'length',
    'stream: the first delta names the role, one id throughout, finish_reason length',
    `role ${show(s.roleFirst)}, ids ${s.ids.size}, finish ${s.finish}`);
  check(usageAddsUp(s.usage) && s.usage.completion_tokens === 12 && s.pieces > 0 &&
    s.pieces <= s.usage.completion_tokens && s.usage.prompt_tokens === r.usage.prompt_tokens,
  'include_usage: the usage chunk arrives; completion_tokens 12 >= the streamed pieces; prompt tokens as not streamed',
  `usage ${show(s.usage)}, ${s.pieces} pieces`);

  const n = await streamChat({ model: MODEL, messages: [user('Once upon a time')], max_tokens: 5, temperature: 0 });
  check(n.usage === null && n.text.length > 0, 'stream without include_usage: no usage chunk', show(n.usage));
});

await step('max_completion_tokens', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [user('The dog')],
    max_completion_tokens: 4, temperature: 0 });
  check(r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 4,
    'max_completion_tokens 4: finish_reason length after 4 tokens', show(r.usage));
  const b = await client.chat.completions.create({ model: MODEL, messages: [user('The dog')],
    max_completion_tokens: 3, max_tokens: 20, temperature: 0 });
  check(b.usage.completion_tokens === 3, 'max_completion_tokens wins over max_tokens', show(b.usage));
});

await step('sampling', async () => {
  const p = { model: MODEL, messages: [user('Lily went to the park')], max_tokens: 30 };
  const a = await client.chat.completions.create({ ...p, temperature: 0 });
  const b = await client.chat.completions.create({ ...p, temperature: 0 });
  check(a.choices[0].message.content === b.choices[0].message.content, 'temperature 0: two requests answer alike',
    `${show(a.choices[0].message.content)} vs ${show(b.choices[0].message.content)}`);
  const s1 = await client.chat.completions.create({ ...p, temperature: 1, seed: 1234 });
  const s2 = await client.chat.completions.create({ ...p, temperature: 1, seed: 1234 });
  const s3 = await client.chat.completions.create({ ...p, temperature: 1, seed: 99 });
  const t1 = s1.choices[0].message.content, t2 = s2.choices[0].message.content, t3 = s3.choices[0].message.content;
  check(t1 === t2, 'temperature 1, seed 1234 twice: the same answer', `${show(t1)} vs ${show(t2)}`);
  check(t1 !== t3, 'temperature 1, another seed: another answer (the seed is used)', show(t1));
});

await step('stop strings', async () => {
  const p = { model: MODEL, messages: [user('Tom had a red ball')], max_tokens: 40, temperature: 0 };
  const full = (await client.chat.completions.create(p)).choices[0].message.content;
  // a stop string from the middle of the greedy answer: a word after the 8th character
  const m = /[A-Za-z]{3,}/.exec(full.slice(8));
  if (!check(m !== null, 'the greedy answer has a word to stop at', show(full))) return;
  const stop = m[0], at = full.indexOf(stop);
  const r = await client.chat.completions.create({ ...p, stop: [stop, 'zzzzqq'] });
  const t = r.choices[0].message.content;
  check(r.choices[0].finish_reason === 'stop' && !t.includes(stop) &&
    full.slice(0, at).trim() === t.trim(),
  `stop ${show(stop)}: finish_reason stop, the answer is what came before it`,
  `finish ${r.choices[0].finish_reason}, ${show(t)}; whole ${show(full)}`);
  check(r.usage.completion_tokens < 40, 'stop: fewer tokens than max_tokens', show(r.usage));
  const s = await streamChat({ ...p, stop });
  check(s.finish === 'stop' && !s.text.includes(stop) && s.text.trim() === t.trim(),
    'stop (a string) streamed: the same cut', `finish ${s.finish}, ${show(s.text)}`);
});

await step('conversation resent statelessly', async () => {
  const sys = { role: 'system', content: 'You tell short stories about animals.' };
  const m1 = user('Once upon a time there was a cat named Tim.');
  const cont0 = await metric('llamad_http_conversations_continued_total');
  const fork0 = await metric('llamad_http_conversations_forked_total');
  const r1 = await client.chat.completions.create({ model: MODEL, messages: [sys, m1], max_tokens: 24, temperature: 0 });
  const a1 = r1.choices[0].message;
  const m2 = user('What did Tim find in the garden?');
  const hist = [sys, m1, { role: 'assistant', content: a1.content }, m2];
  const r2 = await client.chat.completions.create({ model: MODEL, messages: hist, max_tokens: 16, temperature: 0 });
  const cached = r2.usage.prompt_tokens_details?.cached_tokens ?? 0;
  check(cached >= r1.usage.total_tokens - 2 && cached < r2.usage.prompt_tokens,
    'turn 2 resending turn 1: cached_tokens covers the history (turn 1\'s prompt and answer)',
    `cached ${cached}, turn 1 total ${r1.usage.total_tokens}, turn 2 prompt ${r2.usage.prompt_tokens}`);
  const cont1 = await metric('llamad_http_conversations_continued_total');
  check(cont1 === cont0 + 1, 'metrics: llamad_http_conversations_continued_total grew by 1', `${cont0} -> ${cont1}`);

  // the same last turn again: a regeneration forks the held session
  const r3 = await client.chat.completions.create({ model: MODEL, messages: hist, max_tokens: 16, temperature: 0 });
  const fork1 = await metric('llamad_http_conversations_forked_total');
  check(fork1 === fork0 + 1, 'regenerating the last turn: llamad_http_conversations_forked_total grew by 1',
    `${fork0} -> ${fork1}`);
  check(r3.choices[0].message.content === r2.choices[0].message.content,
    'the regenerated turn (a fork rewound by one turn) answers as the first time at temperature 0',
    `${show(r3.choices[0].message.content)} vs ${show(r2.choices[0].message.content)}`);
  const cached3 = r3.usage.prompt_tokens_details?.cached_tokens ?? 0;
  check(cached3 >= r1.usage.total_tokens - 2, 'the fork reuses the history too (cached_tokens)',
    `cached ${cached3}, turn 1 total ${r1.usage.total_tokens}`);

  // turn 3 on the regenerated answer continues (streamed this time)
  const hist3 = [...hist, { role: 'assistant', content: r3.choices[0].message.content }, user('And then?')];
  const s = await streamChat({ model: MODEL, messages: hist3, max_tokens: 8, temperature: 0,
    stream_options: { include_usage: true } });
  const cont2 = await metric('llamad_http_conversations_continued_total');
  check(cont2 === cont1 + 1 && (s.usage?.prompt_tokens_details?.cached_tokens ?? 0) >= r3.usage.total_tokens - 2,
    'turn 3 (streamed) continues the fork: counted, cached_tokens covers turns 1-2',
    `continued ${cont1} -> ${cont2}, usage ${show(s.usage)}, turn 2 total ${r3.usage.total_tokens}`);
});

// The gateway remembers which llamad session holds a conversation; when
// llamad no longer has it (dropped, or a restart without a state dir),
// the next turn must still be answered, on a new session.
await step('a conversation whose session llamad lost', async () => {
  if (!SOCKET || !LLAMACTL) { bad('GW_SOCKET, LLAMACTL not set'); return; }
  const p = { model: MODEL, max_tokens: 8, temperature: 0 };
  let hist = [user('Pip the dog ran to the river.')];
  const a1 = (await client.chat.completions.create({ ...p, messages: hist })).choices[0].message.content;
  hist = [...hist, { role: 'assistant', content: a1 }, user('What did Pip see?')];
  const c0 = await metric('llamad_http_conversations_continued_total');
  const a2 = (await client.chat.completions.create({ ...p, messages: hist })).choices[0].message.content;
  const c1 = await metric('llamad_http_conversations_continued_total');
  check(c1 === c0 + 1, 'turn 2 continues the held session', `${c0} -> ${c1}`);
  let dropped = dropAll(SOCKET);
  hist = [...hist, { role: 'assistant', content: a2 }, user('Was it big?')];
  try {
    const s = await streamChat({ ...p, messages: hist });
    check(s.finish === 'length' && s.text.length > 0,
      `llamactl drop of its session (${dropped.length} dropped), then turn 3 streamed: answered anew`, show(s));
    dropped = dropAll(SOCKET);
    // two messages more than the session held: the first goes as an Append
    hist = [...hist, { role: 'assistant', content: s.text }, user('Then?'),
      { role: 'assistant', content: 'Pip went home.' }, user('And then?')];
    const r = await client.chat.completions.create({ ...p, messages: hist });
    check(r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 8,
      `dropped again (${dropped.length}), then turn 5 with a message to append first: answered anew`, show(r.usage));
  } catch (e) {
    bad(`a turn after llamad lost the session: ${e.constructor.name} ${e.status}: ${e.message}`);
  }
});

await step('text completions', async () => {
  const p = { model: MODEL, prompt: 'Once upon a time, there was a', max_tokens: 10, temperature: 0 };
  const r = await client.completions.create(p);
  const c = r.choices[0];
  check(r.object === 'text_completion' && typeof c.text === 'string' && c.text.length > 0 &&
    c.finish_reason === 'length' && r.usage.completion_tokens === 10 && usageAddsUp(r.usage),
  'completions.create (raw prompt): text, finish_reason length, usage', show(r));
  const stream = await client.completions.create({ ...p, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const x of ch.choices) { text += x.text; if (x.finish_reason) finish = x.finish_reason; }
  }
  check(text === c.text && finish === 'length' && usage && usage.completion_tokens === 10,
    'completions.create streamed: the same text, finish_reason length, usage', `${show(text)}, ${finish}, ${show(usage)}`);
  const d = await client.completions.create({ model: MODEL, prompt: 'The cat', temperature: 0 });
  check(d.usage.completion_tokens <= 16 && d.usage.completion_tokens > 0,
    'completions without max_tokens: OpenAI\'s default of 16 tokens at most', show(d.usage));
});

await step('models', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  check(ids.includes(MODEL) && (!SLOW_MODEL || ids.includes(SLOW_MODEL)), 'models.list(): the configured models',
    show(ids));
  const m = await client.models.retrieve(MODEL);
  check(m.id === MODEL && m.object === 'model', 'models.retrieve(): the model', show(m));
  try {
    await client.models.retrieve('no-such-model');
    bad('models.retrieve() of an unknown model: no error');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404 && String(e.message).includes('no-such-model'),
      'models.retrieve() of an unknown model: 404 naming it', show(e.message));
  }
  // llama-server's paths: OpenAI's routes without /v1, and trailing slashes
  const bare = new OpenAI({ baseURL: URL_, apiKey: 'not-needed', maxRetries: 0, timeout: 30000 });
  const r = await bare.chat.completions.create({ model: MODEL, messages: [user('Once')], max_tokens: 2 });
  check(r.object === 'chat.completion' && r.usage.completion_tokens === 2,
    'a client whose base URL lacks /v1: /chat/completions answers', show(r.usage));
  const res = await fetch(`${URL_}/v1/models/`);
  const body = await res.json();
  check(res.status === 200 && body.object === 'list', 'GET /v1/models/ (a trailing slash): the list',
    `${res.status} ${show(body)}`);
});

async function expectError(what, cls, status, params, words) {
  try {
    const r = await client.chat.completions.create(params);
    bad(`${what}: answered ${show(r).slice(0, 200)}`);
  } catch (e) {
    const msg = String(e.message);
    check(e instanceof cls && e.status === status && words.every((w) => msg.includes(w)),
      `${what}: ${cls.name} ${status} naming ${words.join(', ')}`, `${e.constructor.name} ${e.status}: ${msg}`);
  }
}

await step('errors', async () => {
  await expectError('unknown model', OpenAI.NotFoundError, 404,
    { model: 'no-such-model', messages: [user('hi')] }, ['no-such-model', MODEL]);
  await expectError('n: 2', OpenAI.BadRequestError, 400, { model: MODEL, messages: [user('hi')], n: 2 }, ["'n'"]);
  await expectError('tools', OpenAI.BadRequestError, 400, { model: MODEL, messages: [user('hi')],
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }] }, ["'tools'"]);
  await expectError('empty messages', OpenAI.BadRequestError, 400, { model: MODEL, messages: [] }, ["'messages'"]);
  await expectError('temperature 3', OpenAI.BadRequestError, 400,
    { model: MODEL, messages: [user('hi')], temperature: 3 }, ["'temperature'"]);
  try {
    await client.chat.completions.create({ model: MODEL, messages: [user('hi')], n: 2 });
  } catch (e) {
    check(e.type === 'invalid_request_error', 'a 400 carries type invalid_request_error', show(e.error));
  }
});

await step('abort a stream', async () => {
  if (!SLOW_MODEL || !SLOW_SOCKET || !LLAMACTL) { bad('abort: GW_SLOW_MODEL, GW_SLOW_SOCKET, LLAMACTL not set'); return; }
  const c0 = await metric('llamad_http_cancelled_total');
  const stream = await client.chat.completions.create({ model: SLOW_MODEL, messages: [user('Once upon a time')],
    max_tokens: 400, temperature: 0, stream: true });
  let pieces = 0, busyDuring = null, aborted = false;
  try {
    for await (const ch of stream) {
      if (ch.choices[0]?.delta?.content) pieces++;
      if (pieces === 3) {
        busyDuring = sessions(SLOW_SOCKET).filter((s) => s.busy).length;
        stream.controller.abort();
      }
    }
  } catch (e) {
    aborted = e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError';
    if (!aborted) throw e;
  }
  check(aborted || pieces === 3, 'stream.controller.abort() ends the stream on the client', `${pieces} pieces`);
  check(busyDuring === 1, 'while it streams, llamad has the session busy', `busy sessions: ${busyDuring}`);
  let busy = -1, c1 = NaN;
  for (let i = 0; i < 50; i++) {
    await sleep(100);
    busy = sessions(SLOW_SOCKET).filter((s) => s.busy).length;
    c1 = await metric('llamad_http_cancelled_total');
    if (busy === 0 && c1 === c0 + 1) break;
  }
  check(c1 === c0 + 1, 'the gateway counts the cancelled generation (llamad_http_cancelled_total + 1)', `${c0} -> ${c1}`);
  check(busy === 0, 'llamad\'s session is not left busy after the abort', `busy sessions: ${busy}`);
  const gen = sessions(SLOW_SOCKET).map((s) => s.generated_tokens);
  check(gen.length > 0 && gen.every((g) => g < 400), 'the generation was cut short (fewer than 400 tokens generated)',
    show(gen));
  // the next request on the slow model is answered (nothing stuck)
  const r = await client.chat.completions.create({ model: SLOW_MODEL, messages: [user('Once upon a time')],
    max_tokens: 3, temperature: 0 });
  check(r.usage.completion_tokens === 3, 'a request after the abort is answered', show(r.usage));
});

summary('openai.mjs');
