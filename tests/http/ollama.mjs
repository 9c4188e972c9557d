// tests/http/ollama.mjs — llamad-http through the official Ollama client
// (npm ollama, pinned in package-lock.json): chat and generate, streamed
// and not, raw generate; options num_predict, temperature, seed, stop;
// the done object's counts and durations; list (tags), ps, version; an
// unknown model's error. Prints ok/FAIL lines; exits 1 on any failure.
import { Ollama } from 'ollama';
import { URL_, MODEL, SLOW_MODEL, ok, bad, check, show, step, summary } from './lib.mjs';

const ollama = new Ollama({ host: URL_ });
const user = (content) => ({ role: 'user', content });

// The done object: counts are integers, eval_count > 0, durations numbers.
function doneOk(d, evalCount) {
  const ints = ['prompt_eval_count', 'eval_count', 'total_duration', 'load_duration', 'prompt_eval_duration',
    'eval_duration'].every((k) => Number.isInteger(d[k]) && d[k] >= 0);
  return d.done === true && ints && d.eval_count > 0 && d.prompt_eval_count > 0 && d.total_duration > 0 &&
    d.eval_duration > 0 && (evalCount === undefined || d.eval_count === evalCount);
}
const counts = (d) => show({ done: d.done, done_reason: d.done_reason, prompt_eval_count: d.prompt_eval_count,
  eval_count: d.eval_count, total_duration: d.total_duration, prompt_eval_duration: d.prompt_eval_duration,
  eval_duration: d.eval_duration });

// Consume a stream: the text and the last (done) object.
async function drain(it, field) {
  let text = '', last = null, n = 0, doneSeen = 0;
  for await (const part of it) {
    n++;
    text += field === 'message' ? part.message.content : part.response;
    if (part.done) doneSeen++;
    last = part;
  }
  return { text, last, n, doneSeen };
}

await step('chat', async () => {
  const p = { model: MODEL, messages: [user('Once upon a time')], options: { num_predict: 10, temperature: 0 } };
  const r = await ollama.chat({ ...p, stream: false });
  check(r.model === MODEL && r.message.role === 'assistant' && r.message.content.length > 0 &&
    r.done_reason === 'length' && doneOk(r, 10),
  `chat, not streamed: an assistant message, done_reason length, eval_count 10 (${counts(r)})`, show(r));
  const s = await drain(await ollama.chat({ ...p, stream: true }), 'message');
  check(s.text === r.message.content && s.doneSeen === 1 && s.last.done && s.n > 2,
    `chat streamed: ${s.n} objects, the same text as not streamed, one done object last`,
    `${show(s.text)} vs ${show(r.message.content)}, ${s.doneSeen} done`);
  check(doneOk(s.last, 10) && s.last.done_reason === 'length', `chat streamed: the done object's counts (${counts(s.last)})`,
    show(s.last));
  const t = await ollama.chat({ model: `${MODEL}:latest`, messages: [user('Once upon a time')], stream: false,
    options: { num_predict: 10, temperature: 0 } });
  check(t.message.content === r.message.content, `the model named ${MODEL}:latest answers as ${MODEL}`, show(t));
});

await step('generate', async () => {
  const p = { model: MODEL, prompt: 'Once upon a time, there was a', options: { num_predict: 8, temperature: 0 } };
  const r = await ollama.generate({ ...p, stream: false });
  check(typeof r.response === 'string' && r.response.length > 0 && doneOk(r, 8),
    `generate, not streamed: a response, eval_count 8 (${counts(r)})`, show(r));
  const s = await drain(await ollama.generate({ ...p, stream: true }), 'response');
  check(s.text === r.response && s.doneSeen === 1 && doneOk(s.last, 8),
    'generate streamed: the same response, one done object with the counts', `${show(s.text)} vs ${show(r.response)}`);

  const raw = await ollama.generate({ ...p, raw: true, stream: false });
  const rs = await drain(await ollama.generate({ ...p, raw: true, stream: true }), 'response');
  check(raw.response.length > 0 && doneOk(raw, 8) && rs.text === raw.response && doneOk(rs.last, 8),
    'generate raw: streamed and not answer alike, with counts', `${show(raw.response)} vs ${show(rs.text)}`);
  // raw is the prompt continued as it is: a shorter prompt than the chat template's
  check(raw.prompt_eval_count < r.prompt_eval_count,
    `raw: the prompt is not wrapped in the chat template (${raw.prompt_eval_count} < ${r.prompt_eval_count} prompt tokens)`,
    `${raw.prompt_eval_count} vs ${r.prompt_eval_count}`);
});

await step('options', async () => {
  const p = { model: MODEL, prompt: 'Lily and Tom went to the park', raw: true, stream: false };
  const a = await ollama.generate({ ...p, options: { num_predict: 30, temperature: 0 } });
  const b = await ollama.generate({ ...p, options: { num_predict: 30, temperature: 0 } });
  check(a.response === b.response, 'options.temperature 0: two answers alike', `${show(a.response)} vs ${show(b.response)}`);
  const s1 = await ollama.generate({ ...p, options: { num_predict: 30, temperature: 1, seed: 42 } });
  const s2 = await ollama.generate({ ...p, options: { num_predict: 30, temperature: 1, seed: 42 } });
  const s3 = await ollama.generate({ ...p, options: { num_predict: 30, temperature: 1, seed: 7 } });
  check(s1.response === s2.response, 'options.seed 42 at temperature 1 twice: the same answer',
    `${show(s1.response)} vs ${show(s2.response)}`);
  check(s1.response !== s3.response, 'options.seed 7: another answer', show(s1.response));
  const z = await ollama.generate({ ...p, options: { num_predict: 0, temperature: 0 } });
  check(z.done && z.response.startsWith(a.response) && z.eval_count >= 30,
    `options.num_predict 0: no limit of its own, as Ollama takes it (${z.eval_count} tokens, ${z.done_reason})`, show(z));
  const n = await ollama.generate({ ...p, options: { num_predict: 3, temperature: 0 } });
  check(n.eval_count === 3 && n.done_reason === 'length' && a.response.startsWith(n.response),
    'options.num_predict 3: 3 tokens, done_reason length, the start of the longer answer', show(n));
  const m = /[A-Za-z]{3,}/.exec(a.response.slice(6));
  if (!check(m !== null, 'the greedy answer has a word to stop at', show(a.response))) return;
  const stop = m[0], at = a.response.indexOf(stop);
  const st = await ollama.generate({ ...p, options: { num_predict: 30, temperature: 0, stop: [stop] } });
  check(st.done_reason === 'stop' && !st.response.includes(stop) && st.response === a.response.slice(0, at) &&
    st.eval_count < 30, `options.stop ${show(stop)}: done_reason stop, the answer cut before it`,
  `${show(st.response)} (${st.done_reason}); whole ${show(a.response)}`);
  const cs = await drain(await ollama.chat({ model: MODEL, messages: [user('Tom had a red ball')], stream: true,
    options: { num_predict: 30, temperature: 0 } }), 'message');
  const cm = /[A-Za-z]{3,}/.exec(cs.text.slice(6));
  if (!check(cm !== null, 'the greedy chat answer has a word to stop at', show(cs.text))) return;
  const ct = await drain(await ollama.chat({ model: MODEL, messages: [user('Tom had a red ball')], stream: true,
    options: { num_predict: 30, temperature: 0, stop: [cm[0]] } }), 'message');
  check(ct.last.done_reason === 'stop' && !ct.text.includes(cm[0]) &&
    ct.text.trim() === cs.text.slice(0, cs.text.indexOf(cm[0])).trim(),
  `chat streamed, options.stop ${show(cm[0])}: cut before it`, `${show(ct.text)}; whole ${show(cs.text)}`);
});

await step('list, ps, version', async () => {
  const l = await ollama.list();
  const names = l.models.map((m) => m.name);
  check(names.includes(`${MODEL}:latest`) && (!SLOW_MODEL || names.includes(`${SLOW_MODEL}:latest`)) &&
    l.models.every((m) => m.model === m.name && typeof m.details === 'object'),
  `list(): the configured models as NAME:latest (${names.join(', ')})`, show(l));
  const ps = await ollama.ps();
  check(ps.models.some((m) => m.name === `${MODEL}:latest`), 'ps(): the model whose llamad answers', show(ps));
  const v = await ollama.version();
  // Ollama's API version (clients gate features on it), not llamad's 0.2.0
  const [maj, min] = v.version.split('.').map(Number);
  check(/^\d+\.\d+\.\d+$/.test(v.version) && (maj > 0 || min >= 12) && /^\d+\.\d+\.\d+/.test(v.llamad),
    `version(): Ollama API ${v.version} (at least 0.12), llamad ${v.llamad}`, show(v));
});

await step('errors', async () => {
  for (const [what, call] of [
    ['chat', () => ollama.chat({ model: 'no-such-model', messages: [user('hi')], stream: false })],
    ['generate (streamed)', () => ollama.generate({ model: 'no-such-model', prompt: 'hi', stream: true })],
  ]) {
    try {
      const r = await call();
      bad(`${what} with an unknown model: answered ${show(r)}`);
    } catch (e) {
      check(e.name === 'ResponseError' && e.status_code === 404 && e.error.includes('no-such-model') &&
        e.error.includes(MODEL), `${what}, unknown model: ResponseError 404 naming the models served`,
      `${e.name} ${e.status_code}: ${e.message}`);
    }
  }
  try {
    await ollama.chat({ model: MODEL, messages: [user('hi')], stream: false, options: { temperature: 'hot' } });
    bad('options.temperature "hot": answered');
  } catch (e) {
    check(e.status_code === 400 && e.error.includes('temperature'), 'options.temperature "hot": 400 naming the field',
      `${e.status_code}: ${e.message}`);
  }
});

summary('ollama.mjs');
