// Clients of `infer --serve` (docs/SERVE.md), with Node >= 18 and nothing else but, for `openai`, the
// official openai package: the checks of test/test_serve.sh, the load test of dev/serve_load.sh and the
// benchmark of dev/bench_serve.sh. Loopback only; every request is bounded in time.
//   node dev/serve_client.mjs MODE URL [key=value ...]
// MODE:
//   openai      the openai package: models, a completion, a stream with usage, an error (npm=DIR: its prefix)
//   concurrent  n clients at once, greedy, streamed and not: each text as infer gives it alone
//   bad         every kind of bad request gets its status and an OpenAI error; the server goes on
//   queue       many requests at once at a server of 1 slot and a queue of 1: 200 or an immediate 429
//   slow        a body that takes longer than the server's --timeout: 408
//   disconnect  streams dropped after their first event: their sequences leave, the server goes on
//   drain       SIGTERM to the server (pid=) while a stream runs: the stream completes
//   load        requests=N clients=C with bad ones mixed in: none lost or garbled; the server's memory (pid=)
//   bench       streams=N prompt=P max_tokens=G requests=R: requests/s, output tok/s, time to first token,
//               time per output token (a request's mean gap after its first) and between tokens (p50, p99)
// Checks print "FAIL <what>" lines and end the process with status 1; a skip prints "SKIP <why>".
// For the expected texts the checks run infer itself (infer=PATH model=PATH), so a greedy completion
// is compared with `infer -t 0` on the same prompt.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [mode, base, ...rest] = process.argv.slice(2);
const opt = Object.fromEntries(rest.map((kv) => kv.split(/=(.*)/s).slice(0, 2)));
const num = (key, def) => (opt[key] === undefined ? def : Number(opt[key]));
const failures = [];
const fail = (what) => { failures.push(what); console.log(`FAIL ${what}`); };
const check = (ok, what) => { if (!ok) fail(what); return ok; };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const PROMPTS = ['The sea', 'It is a truth universally acknowledged', 'Once upon a time', 'x', 'The quick brown fox',
                 'In the beginning', '1 2 3 4 5', 'Hello, world. This is a longer prompt that takes more than one ' +
                 'chunk of the prefill to read'];

// ----------------------------------------------------------------------------
// requests

// a POST of body (an object, or raw text) to route: status, the parsed JSON (or null), ms to the answer
async function post(route, body, { headers = {}, timeout = 60000 } = {}) {
  const t0 = performance.now();
  const res = await fetch(base + route, {
    method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body),
    headers: { 'content-type': 'application/json', ...headers }, signal: AbortSignal.timeout(timeout),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by the caller */ }
  return { status: res.status, json, text, ms: performance.now() - t0, headers: res.headers };
}

async function get(route) {
  const res = await fetch(base + route, { signal: AbortSignal.timeout(30000) });
  return { status: res.status, text: await res.text() };
}

// A streamed completion, parsed event by event: the text, the finish reason, usage, whether [DONE] ended it,
// and when each event came (ms from the request). abortAfter: drop the connection after that many events.
async function stream(body, { abortAfter = 0, timeout = 60000, onEvent = null } = {}) {
  const t0 = performance.now();
  const control = new AbortController();
  const timer = setTimeout(() => control.abort(), timeout);
  const out = { status: 0, text: '', finish: null, usage: null, done: false, events: 0, times: [], bad: [], error: null };
  try {
    const res = await fetch(base + '/v1/completions', {
      method: 'POST', body: JSON.stringify({ ...body, stream: true }), headers: { 'content-type': 'application/json' },
      signal: control.signal,
    });
    out.status = res.status;
    if (res.status !== 200) { out.error = await res.text(); return out; }
    const decoder = new TextDecoder();
    let pending = '';
    for await (const piece of res.body) {
      pending += decoder.decode(piece, { stream: true });
      let cut;
      while ((cut = pending.indexOf('\n\n')) >= 0) {
        const event = pending.slice(0, cut);
        pending = pending.slice(cut + 2);
        if (!event.startsWith('data: ')) { out.bad.push(event); continue; }
        const data = event.slice(6);
        if (data === '[DONE]') { out.done = true; continue; }
        let chunk;
        try { chunk = JSON.parse(data); } catch { out.bad.push(data); continue; }
        if (chunk.error) { out.error = chunk.error; continue; }
        if (chunk.usage) { out.usage = chunk.usage; }
        const choice = chunk.choices?.[0];
        if (choice) {
          out.text += choice.text;
          if (choice.finish_reason) { out.finish = choice.finish_reason; }
          if (choice.text.length > 0) { out.times.push(performance.now() - t0); }
        }
        if (onEvent) { onEvent(); }
        if (++out.events === abortAfter) { control.abort(); return out; }
      }
    }
    if (pending.length > 0) { out.bad.push(pending); }
  } catch (e) {
    if (!(abortAfter && out.events >= abortAfter)) { out.error = String(e); }
  } finally {
    clearTimeout(timer);
  }
  return out;
}

// the server's metric `name` (with its labels), or NaN
async function metric(name) {
  const { text } = await get('/metrics');
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.slice(name.length + 1)) : NaN;
}

// what `infer -t 0` writes for prompt (its text decoded as the server decodes bytes: U+FFFD per maximal
// ill-formed subsequence, which is what Node's decoder does), kept in the file cache= across runs
const expectedCache = opt.cache && existsSync(opt.cache) ? JSON.parse(readFileSync(opt.cache, 'utf8')) : {};
function expected(prompt, maxTokens) {
  const key = `${maxTokens} ${prompt}`;
  if (!(key in expectedCache)) {
    const r = spawnSync(opt.infer ?? './infer', ['-m', opt.model, '--device', 'cpu', '-p', prompt, '-n', String(maxTokens),
      '-t', '0', '-q', '1'], { timeout: 120000 });
    if (r.status !== 0) { throw new Error(`infer failed: ${r.stderr}`); }
    expectedCache[key] = r.stdout.toString('utf8').replace(/\n$/, '');
    if (opt.cache) { writeFileSync(opt.cache, JSON.stringify(expectedCache)); }
  }
  return expectedCache[key];
}

async function modelId() {
  const r = await get('/v1/models');
  return JSON.parse(r.text).data[0].id;
}

// an OpenAI error body of this status, code and param (null: not checked)
function isError(r, status, code, param = null) {
  const e = r.json?.error;
  return r.status === status && e && typeof e.message === 'string' && e.message.length > 0 && typeof e.type === 'string' &&
    (code === null || e.code === code) && (param === null || e.param === param);
}

// ----------------------------------------------------------------------------
// the checks

async function openaiChecks() {
  const entry = path.join(opt.npm, 'node_modules', 'openai', 'index.mjs');
  let OpenAI;
  try { OpenAI = (await import(pathToFileURL(entry).href)).default; } catch (e) {
    console.log(`SKIP the openai package's checks (it is not in ${opt.npm}: npm install --prefix ${opt.npm} openai)`);
    return;
  }
  const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60000 });
  const models = await client.models.list();
  const model = models.data[0].id;
  check(models.data.length === 1 && model === opt.id, `openai: models.list() gives ${JSON.stringify(models.data)}`);
  const prompt = 'It is a truth universally acknowledged';
  const c = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0 });
  const want = expected(prompt, 12);
  check(c.object === 'text_completion' && c.choices[0].text === want,
    `openai: completion ${JSON.stringify(c.choices[0].text)}, infer ${JSON.stringify(want)}`);
  check(c.usage.completion_tokens <= 12 && c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens &&
    ['length', 'stop'].includes(c.choices[0].finish_reason), `openai: usage ${JSON.stringify(c.usage)}`);
  const s = await client.completions.create({ model, prompt, max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null;
  for await (const chunk of s) {
    if (chunk.usage) { usage = chunk.usage; }
    if (chunk.choices.length > 0) { text += chunk.choices[0].text; finish = chunk.choices[0].finish_reason ?? finish; }
  }
  check(text === want && finish === c.choices[0].finish_reason && usage?.completion_tokens === c.usage.completion_tokens,
    `openai: stream ${JSON.stringify(text)} (${finish}, ${JSON.stringify(usage)}) vs the completion`);
  try {
    await client.completions.create({ model, prompt, max_tokens: 1000000 });
    fail('openai: max_tokens 1000000 was accepted');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'max_tokens',
      `openai: max_tokens 1000000 gave ${e}`);
  }
  try {
    await client.completions.create({ model: 'gpt-4', prompt });
    fail('openai: another model was accepted');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.code === 'model_not_found', `openai: another model gave ${e}`);
  }
}

async function concurrentChecks() {
  const n = num('n', 32);
  const model = await modelId();
  const jobs = [];
  for (let i = 0; i < n; i++) {
    // 16 (prompt, max_tokens) pairs: infer runs once for each
    const prompt = PROMPTS[i % PROMPTS.length], maxTokens = 8 + (Math.floor(i / PROMPTS.length) % 2) * 8;
    const streamed = i % 2 === 1;
    const body = { model, prompt, max_tokens: maxTokens, temperature: 0 };
    jobs.push((async () => {
      if (streamed) {
        const r = await stream(body);
        return { i, prompt, maxTokens, text: r.text, ok: r.status === 200 && r.done && r.finish !== null && r.bad.length === 0,
                 what: JSON.stringify({ status: r.status, done: r.done, finish: r.finish, bad: r.bad, error: r.error }) };
      }
      const r = await post('/v1/completions', body);
      const choice = r.json?.choices?.[0];
      return { i, prompt, maxTokens, text: choice?.text, what: r.text,
               ok: r.status === 200 && choice && ['stop', 'length'].includes(choice.finish_reason) };
    })());
  }
  const t0 = performance.now();
  const results = await Promise.all(jobs);
  const seconds = (performance.now() - t0) / 1000;
  let same = 0;
  for (const r of results) {
    if (!check(r.ok, `concurrent: client ${r.i}'s answer is not whole: ${r.what}`)) { continue; }
    const want = expected(r.prompt, r.maxTokens);
    if (check(r.text === want, `concurrent: client ${r.i} (${JSON.stringify(r.prompt)}, ${r.maxTokens} tokens) got ` +
      `${JSON.stringify(r.text)}, infer alone ${JSON.stringify(want)}`)) { same++; }
  }
  console.log(`concurrent: ${n} clients at once in ${seconds.toFixed(1)} s, ${same} texts as infer gives them alone`);
}

// the bad requests, each with the status and error code it must get; `vanish` ones drop the connection
function badRequests(model) {
  const long = 'the '.repeat(num('context', 256) + 10);
  return [
    { what: 'malformed JSON', body: '{"prompt": "x",', status: 400, code: 'invalid_json' },
    { what: 'not an object', body: '[1, 2]', status: 400, code: 'invalid_json' },
    { what: 'invalid UTF-8', body: Buffer.from('{"prompt": "\xff"}', 'latin1'), status: 400, code: 'invalid_json' },
    { what: 'prompt of the wrong type', body: { model, prompt: 5 }, status: 400, code: 'invalid_type', param: 'prompt' },
    { what: 'no prompt', body: { model }, status: 400, code: 'missing_required_parameter', param: 'prompt' },
    { what: 'max_tokens of the wrong type', body: { model, prompt: 'x', max_tokens: '5' }, status: 400, param: 'max_tokens' },
    { what: 'max_tokens over the limit', body: { model, prompt: 'x', max_tokens: 100000 }, status: 400, param: 'max_tokens' },
    { what: 'a prompt longer than the context', body: { model, prompt: long, max_tokens: 1 }, status: 400,
      code: 'context_length_exceeded', param: 'prompt' },
    { what: 'temperature out of range', body: { model, prompt: 'x', temperature: 9 }, status: 400, param: 'temperature' },
    { what: 'an unknown field', body: { model, prompt: 'x', best_of: 1, frobnicate: true }, status: 400,
      code: 'unknown_parameter', param: 'frobnicate' },
    { what: 'an unsupported value', body: { model, prompt: 'x', n: 3 }, status: 400, param: 'n' },
    { what: 'echo', body: { model, prompt: 'x', echo: true }, status: 400, param: 'echo' },
    { what: 'five stop strings', body: { model, prompt: 'x', stop: ['a', 'b', 'c', 'd', 'e'] }, status: 400, param: 'stop' },
    { what: 'another model', body: { model: 'gpt-4', prompt: 'x' }, status: 404, code: 'model_not_found' },
    { what: 'an unknown route', route: '/v2/completions', body: { model, prompt: 'x' }, status: 404, code: 'not_found' },
    { what: 'a GET of completions', method: 'GET', route: '/v1/completions', status: 405, code: 'method_not_allowed' },
    { what: 'a POST of health', route: '/health', body: {}, status: 405, code: 'method_not_allowed' },
    { what: 'a body over --max-body', body: { model, prompt: 'x'.repeat(num('max_body', 4096)) }, status: 413,
      code: 'request_too_large' },
    { what: 'a chunked body over --max-body', chunked: true, body: 'x'.repeat(num('max_body', 4096) + 10), status: 413,
      code: 'request_too_large' },
    { what: 'a body cut off (the client vanishes)', vanish: true },
  ];
}

// sends one bad request; returns an error description, or null when it got what it must
async function sendBad(b) {
  if (b.vanish) {
    await new Promise((resolve) => {
      const url = new URL(base);
      const sock = net.connect(Number(url.port), url.hostname, () => {
        sock.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"pro');
        setTimeout(() => { sock.destroy(); resolve(); }, 20);
      });
      sock.on('error', resolve);
    });
    return null;
  }
  let r;
  if (b.chunked) { // no Content-Length: the server finds the size as the body comes
    const body = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode(b.body)); c.close(); } });
    const res = await fetch(base + '/v1/completions', { method: 'POST', body, duplex: 'half',
      headers: { 'content-type': 'application/json' }, signal: AbortSignal.timeout(30000) });
    const text = await res.text();
    r = { status: res.status, text, json: (() => { try { return JSON.parse(text); } catch { return null; } })() };
  } else if (b.method === 'GET') {
    const g = await get(b.route);
    r = { status: g.status, text: g.text, json: JSON.parse(g.text) };
  } else {
    const body = Buffer.isBuffer(b.body) ? b.body.toString('latin1') : b.body;
    if (Buffer.isBuffer(b.body)) { // raw bytes, not text
      const res = await fetch(base + (b.route ?? '/v1/completions'), { method: 'POST', body: b.body,
        headers: { 'content-type': 'application/json' }, signal: AbortSignal.timeout(30000) });
      const text = await res.text();
      r = { status: res.status, text, json: JSON.parse(text) };
    } else {
      r = await post(b.route ?? '/v1/completions', body);
    }
  }
  return isError(r, b.status, b.code ?? null, b.param ?? null) ? null : `got ${r.status} ${r.text.slice(0, 300)}`;
}

async function badChecks() {
  const model = await modelId();
  for (const b of badRequests(model)) {
    const err = await sendBad(b);
    check(err === null, `bad: ${b.what}: expected ${b.status} ${b.code ?? ''} ${b.param ?? ''}, ${err}`);
  }
  const r = await post('/v1/completions', { model, prompt: 'The sea', max_tokens: 5, temperature: 0 });
  check(r.status === 200 && r.json.choices[0].text === expected('The sea', 5), `bad: a good request after them: ${r.text}`);
  check((await get('/health')).status === 200, 'bad: the server is healthy after them');
}

async function queueChecks() {
  const model = await modelId();
  const n = num('n', 24);
  const results = await Promise.all(Array.from({ length: n }, () =>
    post('/v1/completions', { model, prompt: 'The sea', max_tokens: num('max_tokens', 40), temperature: 0 })));
  const ok = results.filter((r) => r.status === 200 && r.json?.choices?.[0]?.finish_reason);
  const full = results.filter((r) => isError(r, 429, 'queue_full') && r.headers.get('retry-after') === '1');
  check(ok.length + full.length === n, `queue: answers other than 200 and 429: ${results.filter((r) => r.status !== 200 &&
    r.status !== 429).map((r) => r.text).join(' | ')}`);
  // (how many get in depends on how fast the scheduler takes the first from the queue: one, two or a few)
  check(ok.length >= 1 && full.length >= 1, `queue: ${ok.length} done and ${full.length} refused of ${n} (1 slot, a queue of 1)`);
  const slowest = Math.max(...full.map((r) => r.ms));
  check(slowest < 2000, `queue: a 429 took ${slowest.toFixed(0)} ms`);
  console.log(`queue: ${n} at once: ${ok.length} done, ${full.length} refused with 429, the slowest refusal in ${slowest.toFixed(0)} ms`);
}

async function slowChecks() {
  const seconds = num('seconds', 3);
  const body = JSON.stringify({ prompt: 'The sea', max_tokens: 2 });
  const reply = await new Promise((resolve) => {
    const url = new URL(base);
    let got = '';
    const sock = net.connect(Number(url.port), url.hostname, async () => {
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`);
      const pieces = 6;
      for (let k = 0; k < pieces; k++) { // a byte now and then, never silent for long
        await sleep((seconds * 1000) / pieces);
        const from = Math.floor((k * body.length) / pieces), to = Math.floor(((k + 1) * body.length) / pieces);
        if (!sock.destroyed) { sock.write(body.slice(from, to)); }
      }
    });
    sock.on('data', (d) => { got += d; });
    sock.on('close', () => resolve(got));
    sock.on('error', () => resolve(got));
    setTimeout(() => { sock.destroy(); }, (seconds + 10) * 1000);
  });
  const status = Number(reply.split(' ')[1]);
  const json = JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4) || 'null');
  check(status === 408 && json?.error?.code === 'request_timeout', `slow: a body over ${seconds} s got ${reply.slice(0, 300)}`);
  check((await get('/health')).status === 200, 'slow: the server is healthy after');
}

async function disconnectChecks() {
  const model = await modelId();
  const before = await metric('serve_requests_cancelled_total{reason="client"}');
  const n = num('n', 4);
  await Promise.all(Array.from({ length: n }, () =>
    stream({ model, prompt: 'Once upon a time', max_tokens: num('max_tokens', 200), temperature: 0 }, { abortAfter: 1 })));
  let active = NaN, cancelled = NaN;
  for (let k = 0; k < 100; k++) { // until the slots are free (a step or two)
    active = await metric('serve_active_sequences');
    cancelled = await metric('serve_requests_cancelled_total{reason="client"}');
    if (active === 0) { break; }
    await sleep(50);
  }
  check(active === 0, `disconnect: ${active} sequences still active after their clients left`);
  check(cancelled > before, `disconnect: none of ${n} streams dropped after their first event was cancelled`);
  const r = await post('/v1/completions', { model, prompt: 'The sea', max_tokens: 5, temperature: 0 });
  check(r.status === 200 && r.json.choices[0].text === expected('The sea', 5), `disconnect: a request after: ${r.text}`);
  console.log(`disconnect: ${cancelled - before} of ${n} streams cancelled when their clients left, the slots free again`);
}

// a long stream; at its first event the server gets SIGTERM (pid=): the stream still completes
async function drainChecks() {
  const model = await modelId();
  const body = { model, prompt: 'Once upon a time', max_tokens: num('max_tokens', 200), temperature: 0 };
  const want = expected(body.prompt, body.max_tokens);
  let signalled = false;
  const r = await stream(body, { onEvent: () => { if (!signalled) { process.kill(num('pid', 0), 'SIGTERM'); signalled = true; } } });
  check(signalled && r.status === 200 && r.done && r.text === want, `drain: the stream running at SIGTERM got ` +
    `${JSON.stringify({ status: r.status, done: r.done, finish: r.finish, error: r.error })}`);
}

// ----------------------------------------------------------------------------
// the load test and the benchmark

function rss(pid) { // kB
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : NaN;
}

async function load() {
  const total = num('requests', 1000), clients = num('clients', 32), pid = num('pid', 0), badShare = num('bad', 0.3);
  const model = await modelId();
  const bad = badRequests(model);
  for (const prompt of PROMPTS) { expected(prompt, 8); expected(prompt, 16); } // infer runs before the clocks start
  let next = 0, ok = 0, garbled = 0, lost = 0, refused = 0, badOk = 0, dropped = 0;
  const memory = [];
  const worker = async (w) => {
    for (let k; (k = next++) < total;) {
      if (pid && k % 100 === 0) { memory.push([k, rss(pid)]); }
      const roll = (k * 7919 + w * 104729) % 1000 / 1000;
      try {
        if (roll < badShare * 0.8) { // a bad request
          const b = bad[k % bad.length];
          const err = await sendBad(b);
          if (err === null) { badOk++; } else { garbled++; console.log(`FAIL load: bad request ${b.what}: ${err}`); }
          continue;
        }
        if (roll < badShare) { // a stream dropped after its first event
          await stream({ model, prompt: PROMPTS[k % PROMPTS.length], max_tokens: 20, temperature: 0 }, { abortAfter: 1 });
          dropped++;
          continue;
        }
        const prompt = PROMPTS[k % PROMPTS.length], maxTokens = 8 + (Math.floor(k / PROMPTS.length) % 2) * 8;
        const body = { model, prompt, max_tokens: maxTokens, temperature: 0 };
        const want = expected(prompt, maxTokens);
        if (k % 2) {
          const r = await stream(body);
          if (r.status === 429) { refused++; continue; }
          if (r.status === 200 && r.done && r.bad.length === 0 && r.text === want && r.finish) { ok++; }
          else { garbled++; console.log(`FAIL load: stream ${k}: ${JSON.stringify(r)} want ${JSON.stringify(want)}`); }
        } else {
          const r = await post('/v1/completions', body);
          if (r.status === 429) { refused++; continue; }
          if (r.status === 200 && r.json?.choices?.[0]?.text === want) { ok++; }
          else { garbled++; console.log(`FAIL load: request ${k}: ${r.status} ${r.text.slice(0, 300)} want ${JSON.stringify(want)}`); }
        }
      } catch (e) {
        lost++;
        console.log(`FAIL load: request ${k} got no answer: ${e}`);
      }
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, (_, w) => worker(w)));
  const seconds = (performance.now() - t0) / 1000;
  if (pid) { memory.push([total, rss(pid)]); }
  const health = (await get('/health')).status;
  check(health === 200, `load: the server's health after: ${health}`);
  check(lost === 0 && garbled === 0, `load: ${lost} lost, ${garbled} garbled`);
  console.log(`load: ${total} requests from ${clients} clients in ${seconds.toFixed(1)} s: ${ok} good ones as infer gives ` +
    `them, ${refused} refused (429), ${badOk} bad ones answered as they must be, ${dropped} streams dropped by their ` +
    `client; ${lost} lost, ${garbled} garbled`);
  if (pid) {
    const kb = memory.map(([, m]) => m);
    console.log(`load: the server's resident memory (MB) at ${memory.map(([k]) => k).join(', ')} requests: ` +
      kb.map((m) => (m / 1024).toFixed(1)).join(', '));
    // from the 200th request on (the allocators settle over the first), or the last two samples of a short run
    let from = memory.findIndex(([k]) => k >= 200);
    if (from < 0 || from > kb.length - 2) { from = Math.max(0, kb.length - 2); }
    const growth = (Math.max(...kb.slice(from)) - kb[from]) / 1024;
    check(growth < num('max_growth_mb', 16), `load: memory grew by ${growth.toFixed(1)} MB from request ${memory[from][0]} on`);
    console.log(`load: from request ${memory[from][0]} on the memory grew by ${growth.toFixed(1)} MB at most`);
  }
}

const percentile = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN; };

// words that GPT-2 (and most BPE vocabularies) keep as one token each with their leading space
const WORDS = ' the of and to in is was for that on with as by at from his he it an are be this which or had not but'.split(' ').slice(1);

async function bench() {
  const streams = num('streams', 16), promptTokens = num('prompt', 128), maxTokens = num('max_tokens', 128);
  const requests = num('requests', streams * 4);
  const model = await modelId();
  let next = 0, tokens = 0, promptSeen = 0, done = 0;
  const ttft = [], tpot = [], itl = [], failed = [];
  const worker = async (w) => {
    for (let k; (k = next++) < requests;) {
      let prompt = '';
      for (let i = 0; i < promptTokens - 1; i++) { prompt += ' ' + WORDS[(k * 31 + i * 7 + w) % WORDS.length]; }
      const r = await stream({ model, prompt, max_tokens: maxTokens, temperature: 0, stream_options: { include_usage: true } },
        { timeout: 600000 });
      if (r.status !== 200 || !r.done || !r.usage) { failed.push(r.error ?? r.status); continue; }
      done++;
      tokens += r.usage.completion_tokens;
      promptSeen += r.usage.prompt_tokens;
      if (r.times.length > 0) { ttft.push(r.times[0]); }
      const n = r.times.length;
      if (r.usage.completion_tokens > 1 && n > 1) { tpot.push((r.times[n - 1] - r.times[0]) / (r.usage.completion_tokens - 1)); }
      for (let i = 1; i < n; i++) { itl.push(r.times[i] - r.times[i - 1]); }
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: streams }, (_, w) => worker(w)));
  const seconds = (performance.now() - t0) / 1000;
  check(failed.length === 0, `bench: ${failed.length} requests failed: ${failed.slice(0, 3).join(' | ')}`);
  const line = {
    label: opt.label ?? '', streams, prompt_tokens: +(promptSeen / Math.max(done, 1)).toFixed(1), max_tokens: maxTokens,
    requests: done, seconds: +seconds.toFixed(2), requests_per_s: +(done / seconds).toFixed(3),
    output_tok_per_s: +(tokens / seconds).toFixed(1),
    ttft_ms_p50: +percentile(ttft, 0.5).toFixed(1), ttft_ms_p99: +percentile(ttft, 0.99).toFixed(1),
    tpot_ms_p50: +percentile(tpot, 0.5).toFixed(2), tpot_ms_p99: +percentile(tpot, 0.99).toFixed(2),
    itl_ms_p50: +percentile(itl, 0.5).toFixed(2), itl_ms_p99: +percentile(itl, 0.99).toFixed(2),
  };
  console.log(JSON.stringify(line));
}

const modes = { openai: openaiChecks, concurrent: concurrentChecks, bad: badChecks, queue: queueChecks, slow: slowChecks,
                disconnect: disconnectChecks, drain: drainChecks, load, bench };
if (!modes[mode] || !base) {
  console.log(`usage: node dev/serve_client.mjs ${Object.keys(modes).join('|')} URL [key=value ...]`);
  process.exit(2);
}
try {
  await modes[mode]();
} catch (e) {
  fail(`${mode}: ${e.stack ?? e}`);
}
process.exit(failures.length ? 1 : 0);
