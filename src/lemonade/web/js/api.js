// The server's public API, as every view uses it: JSON calls, SSE streams, WebSockets, the API key.
// Nothing here is private to the app: each call is one a script could make.

const KEY_STORE = 'lemonade.apiKey';
export const API = '/v1';

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

export function apiKey() { return localStorage.getItem(KEY_STORE) || ''; }

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
}

let pendingPrompt = null;

/** Ask for the key once, however many requests were refused at the same time. */
function askForKey(refusedKey) {
  if (pendingPrompt) return pendingPrompt;
  const dialog = document.getElementById('key-dialog');
  const input = document.getElementById('key-input');
  const message = document.getElementById('key-message');
  message.textContent = refusedKey
    ? 'The server refused this API key. Enter the right one.'
    : 'This server requires an API key.';
  message.className = refusedKey ? 'error' : '';
  input.value = '';
  input.setAttribute('aria-invalid', refusedKey ? 'true' : 'false');
  pendingPrompt = new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      setApiKey(input.value.trim());
      pendingPrompt = null;
      resolve();
    }, { once: true });
  });
  dialog.showModal();
  return pendingPrompt;
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

async function errorOf(resp) {
  const text = await resp.text();
  let body = text;
  let message = text || resp.statusText;
  try {
    body = JSON.parse(text);
    const err = body.error;
    message = (err && (err.message || err)) || body.message || body.detail || message;
    if (typeof message !== 'string') message = JSON.stringify(message);
  } catch { /* not JSON */ }
  return new ApiError(resp.status, message, body);
}

/** fetch() with the key; a 401 asks for the key and tries again. Returns the Response. */
export async function send(path, { method = 'GET', body, signal } = {}) {
  for (;;) {
    const sentKey = apiKey();
    const opts = { method, signal, headers: headers() };
    if (body instanceof FormData) opts.body = body;
    else if (body !== undefined) {
      opts.body = JSON.stringify(body);
      opts.headers['Content-Type'] = 'application/json';
    }
    const resp = await fetch(path.startsWith('/') && !path.startsWith(API) ? API + path : path, opts);
    if (resp.status === 401) {
      if (apiKey() === sentKey) await askForKey(sentKey);
      continue;
    }
    if (!resp.ok) throw await errorOf(resp);
    return resp;
  }
}

/** A JSON (or text) API call. */
export async function call(path, opts) {
  const resp = await send(path, opts);
  const type = resp.headers.get('content-type') || '';
  return type.includes('json') ? resp.json() : resp.text();
}

/** Server-sent events of a response, as {event, data} (data parsed as JSON when it is JSON). */
export async function* events(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let event = 'message';
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl).replace(/\r$/, '');
      buffer = buffer.slice(nl + 1);
      if (line === '') {
        if (data.length) {
          const text = data.join('\n');
          let parsed = text;
          try { parsed = JSON.parse(text); } catch { /* [DONE] and friends */ }
          yield { event, data: parsed };
        }
        event = 'message';
        data = [];
      } else if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
  }
}

/** A WebSocket to the server. Browsers cannot set headers on one, so the key travels as the
 * `openai-insecure-api-key.<key>` subprotocol (OpenAI's browser convention). Call `checkKey()` first. */
export function socket(path) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const key = apiKey();
  return new WebSocket(`${scheme}//${location.host}${path}`, key ? [`openai-insecure-api-key.${key}`] : []);
}

/** Make sure the stored key works (asking for it if needed) before opening a WebSocket. */
export async function checkKey() { await call('/health'); }
