// tests/http/lib.mjs — what the client tests share: ok/FAIL lines (the
// shell tests' convention), the gateway's address from the environment,
// its Prometheus counters, and llamactl's view of llamad's sessions.
//
// Env (set by tests/integration/http_gateway.sh):
//   GW_URL         the gateway on loopback TCP (http://127.0.0.1:PORT)
//   GW_MODEL       the model name it serves on the stories260K llamad
//   GW_SLOW_MODEL  a second model: a llamad slowed per step (cancellation)
//   GW_SLOW_SOCKET that llamad's socket; LLAMACTL the llamactl binary
//   GW_SOCKET      the socket of GW_MODEL's llamad
import { execFileSync } from 'node:child_process';

export const URL_ = need('GW_URL');
export const MODEL = need('GW_MODEL');
export const SLOW_MODEL = process.env.GW_SLOW_MODEL;
export const SLOW_SOCKET = process.env.GW_SLOW_SOCKET;
export const LLAMACTL = process.env.LLAMACTL;
export const SOCKET = process.env.GW_SOCKET;

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.log(`FAIL: ${name} is not set`);
    process.exit(1);
  }
  return v;
}

let failed = 0, passed = 0;
export function ok(msg) { passed++; console.log(`ok   ${msg}`); }
export function bad(msg) { failed++; process.exitCode = 1; console.log(`FAIL: ${msg}`); }
export function check(cond, msg, detail) {
  if (cond) ok(msg);
  else bad(detail === undefined ? msg : `${msg}: ${detail}`);
  return !!cond;
}
export const show = (v) => JSON.stringify(v);

// Run one group of checks; an exception fails it (never silently).
export async function step(name, fn) {
  try {
    await fn();
  } catch (e) {
    bad(`${name}: threw ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
  }
}

// The end: a summary line; the exit status says whether anything failed.
export function summary(what) {
  console.log(`${what}: ${passed} checks passed, ${failed} failed`);
  if (passed === 0) {
    console.log(`FAIL: ${what} checked nothing`);
    process.exitCode = 1;
  }
}

// GET /metrics: the value of an unlabelled sample (NaN when missing).
export async function metric(name) {
  const r = await fetch(`${URL_}/metrics`);
  const text = await r.text();
  for (const line of text.split('\n'))
    if (line.startsWith(name + ' ')) return Number(line.slice(name.length + 1));
  return NaN;
}

// llamactl --json sessions on sock: the sessions llamad holds.
export function sessions(sock) {
  const out = execFileSync(LLAMACTL, ['--socket', sock, '--json', 'sessions'], { encoding: 'utf8' });
  return JSON.parse(out);
}

// llamactl drop: every session llamad at sock holds (their names).
export function dropAll(sock) {
  const names = sessions(sock).map((s) => s.session);
  for (const n of names) execFileSync(LLAMACTL, ['--socket', sock, 'drop', n]);
  return names;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
