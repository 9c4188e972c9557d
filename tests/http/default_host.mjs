// tests/http/default_host.mjs — the Ollama npm client as it comes, with no
// host given (its default, http://127.0.0.1:11434), against llamad-http
// listening on the installed llamad-http.socket's TCP port: the model is
// listed and a chat is answered. Env: GW_URL (that address, for lib.mjs),
// GW_MODEL.
import { Ollama } from 'ollama';
import { MODEL, check, show, step, summary } from './lib.mjs';

const ollama = new Ollama();   // no host: Ollama's default
await step('the default host', async () => {
  const l = await ollama.list();
  check(l.models.some((m) => m.name === `${MODEL}:latest`),
    `new Ollama() with no host lists ${MODEL}:latest`, show(l));
  const r = await ollama.chat({ model: MODEL, messages: [{ role: 'user', content: 'Once upon a time' }],
    stream: false, options: { num_predict: 8, temperature: 0 } });
  check(r.done && r.message.content.length > 0 && r.eval_count === 8,
    'and its chat is answered (8 tokens)', show(r));
});
summary('default_host.mjs');
