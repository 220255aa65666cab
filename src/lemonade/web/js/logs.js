// Live server logs over the /logs/stream WebSocket: level filter, text filter, pause.
import { checkKey, socket } from './api.js';
import { clear, h } from './ui.js';

const MAX_LINES = 5000;
const LEVELS = ['Trace', 'Debug', 'Info', 'Warning', 'Error', 'Critical'];

export function create(root) {
  const level = h('select', { 'aria-label': 'Lowest level shown', onchange: redraw },
    LEVELS.map((l) => h('option', { value: l, selected: l === 'Info' }, `${l} and above`)));
  const text = h('input', { type: 'search', placeholder: 'Filter text', 'aria-label': 'Filter log lines', oninput: redraw });
  const pause = h('button', { type: 'button', 'aria-pressed': 'false', onclick: togglePause }, 'Pause');
  const state = h('span', { class: 'hint', id: 'logs-state', 'aria-live': 'polite' }, 'connecting…');
  const out = h('pre', { class: 'logs', id: 'log-lines', tabindex: 0, 'aria-label': 'Server log' });
  root.append(h('div', { class: 'row wrap toolbar' }, level, text, pause, state), out);

  const entries = [];
  let paused = false;
  let held = [];
  let lastSeq = null;
  let ws = null;
  let retry = 1000;

  const rank = (sev) => Math.max(0, LEVELS.findIndex((l) => l.toLowerCase() === String(sev).toLowerCase()));
  const shown = (e) => rank(e.severity) >= LEVELS.indexOf(level.value)
    && (!text.value || e.line.toLowerCase().includes(text.value.toLowerCase()));
  const lineOf = (e) => h('div', { class: `log ${String(e.severity).toLowerCase()}` }, e.line);

  function redraw() { clear(out, entries.filter(shown).map(lineOf)); out.scrollTop = out.scrollHeight; }

  function add(list) {
    entries.push(...list);
    if (entries.length > MAX_LINES) entries.splice(0, entries.length - MAX_LINES);
    if (list.length) lastSeq = list[list.length - 1].seq;
    const atBottom = out.scrollHeight - out.scrollTop - out.clientHeight < 40;
    for (const e of list.filter(shown)) out.append(lineOf(e));
    while (out.childElementCount > MAX_LINES) out.firstElementChild.remove();
    if (atBottom) out.scrollTop = out.scrollHeight;
  }

  function togglePause() {
    paused = !paused;
    pause.textContent = paused ? 'Resume' : 'Pause';
    pause.setAttribute('aria-pressed', String(paused));
    if (!paused) { add(held); held = []; }
    state.textContent = paused ? 'paused (lines are kept)' : 'live';
  }

  async function connect() {
    try { await checkKey(); } catch { /* the socket reports it */ }
    ws = socket('/logs/stream');
    ws.onopen = () => { retry = 1000; state.textContent = paused ? 'paused' : 'live'; ws.send(JSON.stringify({ type: 'logs.subscribe', after_seq: lastSeq })); };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      const list = data.type === 'logs.snapshot' ? data.entries : data.type === 'logs.entry' ? [data.entry] : [];
      if (paused) held.push(...list); else add(list);
    };
    ws.onclose = () => {
      state.textContent = 'disconnected, reconnecting…';
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 15000);
    };
  }

  connect();
  return {};
}
