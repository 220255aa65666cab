// Chat: model picker, streamed replies as Markdown, stop, conversations kept in localStorage,
// system prompt and sampling settings, image attachments for vision models, reasoning folded,
// tokens/s and time to first token from /v1/stats under each reply.
import { call, send, events } from './api.js';
import { render } from './markdown.js';
import { kindOf, loaded, refreshHealth, state, subscribe } from './state.js';
import { busy, clear, field, h, toast } from './ui.js';

const CHATS = 'lemonade.chats';
const SETTINGS = 'lemonade.chatSettings';
const DEFAULTS = { system: '', temperature: '', top_p: '', max_tokens: '' };

function load(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}
function save(key, value) {
  try { localStorage.setItem(key, JSON.stringify(value)); } catch (err) { toast(`Not saved in the browser: ${err.message}`, 'error'); }
}
const newChat = () => ({ id: crypto.randomUUID?.() || String(Date.now()), title: 'New chat', model: '', messages: [] });

export function create(root) {
  let chats = load(CHATS, []);
  if (!chats.length) chats = [newChat()];
  let active = chats[0];
  const settings = { ...DEFAULTS, ...load(SETTINGS, {}) };
  let controller = null;
  let attachments = [];

  const list = h('ul', { class: 'chat-list', 'aria-label': 'Conversations' });
  const picker = h('select', { id: 'chat-model', 'aria-label': 'Model' });
  const messages = h('div', { class: 'messages', 'aria-live': 'polite', 'aria-label': 'Messages' });
  const input = h('textarea', { id: 'chat-input', rows: 2, placeholder: 'Message (Enter to send, Shift+Enter for a new line)', 'aria-label': 'Message' });
  const sendButton = h('button', { type: 'submit', class: 'primary', id: 'chat-send' }, 'Send');
  const stopButton = h('button', { type: 'button', id: 'chat-stop', hidden: true, onclick: () => controller?.abort() }, 'Stop');
  const fileInput = h('input', { type: 'file', accept: 'image/*', multiple: true, hidden: true, 'aria-label': 'Attach images' });
  const attachButton = h('button', { type: 'button', class: 'icon', title: 'Attach an image (vision models)', 'aria-label': 'Attach an image', onclick: () => fileInput.click() }, '📎');
  const attachList = h('div', { class: 'attachments' });

  const numberInput = (key, label, attrs) => field(label, h('input', {
    type: 'number', value: settings[key], placeholder: 'default', ...attrs,
    oninput: (e) => { settings[key] = e.target.value; save(SETTINGS, settings); },
  }));
  const settingsPanel = h('details', { class: 'chat-settings' }, h('summary', {}, 'Settings'),
    field('System prompt', h('textarea', { rows: 3, value: settings.system, oninput: (e) => { settings.system = e.target.value; save(SETTINGS, settings); } })),
    h('div', { class: 'row wrap' },
      numberInput('temperature', 'Temperature', { min: 0, max: 2, step: 0.1 }),
      numberInput('top_p', 'Top p', { min: 0, max: 1, step: 0.05 }),
      numberInput('max_tokens', 'Max tokens', { min: 1, step: 1 })));

  const form = h('form', { class: 'composer', onsubmit: (e) => { e.preventDefault(); submit(); } },
    attachList, h('div', { class: 'row' }, attachButton, fileInput, input, sendButton, stopButton));
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  fileInput.addEventListener('change', async () => {
    for (const file of fileInput.files) {
      const url = await new Promise((resolve) => { const r = new FileReader(); r.onload = () => resolve(r.result); r.readAsDataURL(file); });
      attachments.push({ name: file.name, url });
    }
    fileInput.value = '';
    drawAttachments();
  });

  root.append(h('div', { class: 'chat' },
    h('aside', { class: 'chat-side' },
      h('button', { class: 'primary', onclick: () => { active = newChat(); chats.unshift(active); persist(); draw(); input.focus(); } }, '+ New chat'),
      list),
    h('div', { class: 'chat-main' },
      h('div', { class: 'chat-head row wrap' }, h('label', { class: 'inline', for: 'chat-model' }, 'Model'), picker, settingsPanel),
      messages, form)));

  function persist() { save(CHATS, chats.slice(0, 50)); }

  function drawAttachments() {
    clear(attachList, attachments.map((a, i) => h('span', { class: 'chip' }, h('img', { src: a.url, alt: a.name, height: 32 }),
      h('button', { type: 'button', class: 'icon', 'aria-label': `Remove ${a.name}`, onclick: () => { attachments.splice(i, 1); drawAttachments(); } }, '×'))));
  }

  function chatModels() {
    const live = loaded().filter((m) => (m.type || 'llm') === 'llm').map((m) => m.model_name);
    const downloaded = state.models.filter((m) => m.downloaded && kindOf(m) === 'chat' && !live.includes(m.id)).map((m) => m.id);
    return { live, downloaded };
  }

  function drawPicker() {
    const { live, downloaded } = chatModels();
    const chosen = active.model || picker.value || live[0] || downloaded[0] || '';
    const group = (label, names) => names.length ? h('optgroup', { label }, names.map((n) => h('option', { value: n }, n))) : null;
    clear(picker, group('Loaded', live), group('Downloaded', downloaded));
    if (!live.length && !downloaded.length) picker.append(h('option', { value: '' }, 'No model downloaded yet: see Models'));
    if (chosen && ![...live, ...downloaded].includes(chosen)) picker.append(h('option', { value: chosen }, `${chosen} (not available)`));
    picker.value = chosen;
    const vision = state.models.find((m) => m.id === picker.value)?.labels?.includes('vision');
    attachButton.hidden = !vision;
  }
  picker.addEventListener('change', () => { active.model = picker.value; persist(); drawPicker(); });

  function drawList() {
    clear(list, chats.map((c) => h('li', { class: c === active ? 'active' : '' },
      h('button', { class: 'link', 'aria-current': c === active ? 'true' : null, onclick: () => { active = c; draw(); } }, c.title),
      h('button', { class: 'icon', 'aria-label': `Delete conversation ${c.title}`, onclick: () => {
        chats = chats.filter((x) => x !== c);
        if (!chats.length) chats = [newChat()];
        if (active === c) active = chats[0];
        persist(); draw();
      } }, '×'))));
  }

  function textOf(content) {
    return Array.isArray(content) ? content.filter((p) => p.type === 'text').map((p) => p.text).join('\n') : content;
  }

  function messageView(m) {
    const body = h('div', { class: 'content' });
    const el = h('article', { class: `message ${m.role}`, 'aria-label': m.role === 'user' ? 'You' : 'Assistant' });
    if (m.reasoning) {
      const thinking = h('div', { class: 'content reasoning' });
      render(thinking, m.reasoning);
      el.append(h('details', { class: 'reasoning' }, h('summary', {}, 'Reasoning'), thinking));
    }
    el.append(body);
    if (m.role === 'user') {
      body.textContent = textOf(m.content);
      for (const p of Array.isArray(m.content) ? m.content : []) {
        if (p.type === 'image_url') body.append(h('img', { src: p.image_url.url, alt: 'attached image', class: 'attached' }));
      }
    } else render(body, m.content);
    if (m.stats) el.append(h('div', { class: 'stats' }, m.stats));
    if (m.error) el.append(h('div', { class: 'error', role: 'alert' }, m.error));
    return el;
  }

  function drawMessages() {
    clear(messages, active.messages.length ? active.messages.map(messageView)
      : h('p', { class: 'empty' }, 'Pick a model and send a message. Conversations stay in this browser.'));
    messages.scrollTop = messages.scrollHeight;
  }

  function draw() { drawList(); drawPicker(); drawMessages(); }

  function requestBody(model) {
    const msgs = [];
    if (settings.system.trim()) msgs.push({ role: 'system', content: settings.system });
    for (const m of active.messages) if (m.role === 'user' || m.content) msgs.push({ role: m.role, content: m.content });
    const body = { model, messages: msgs, stream: true };
    for (const key of ['temperature', 'top_p', 'max_tokens']) {
      if (settings[key] !== '' && settings[key] !== null) body[key] = Number(settings[key]);
    }
    return body;
  }

  async function submit() {
    const text = input.value.trim();
    const model = picker.value;
    if (controller || (!text && !attachments.length)) return;
    if (!model) { toast('Download a chat model first (Models tab).', 'error'); return; }
    active.model = model;
    const content = attachments.length
      ? [{ type: 'text', text }, ...attachments.map((a) => ({ type: 'image_url', image_url: { url: a.url } }))]
      : text;
    active.messages.push({ role: 'user', content });
    if (active.title === 'New chat') active.title = text.slice(0, 40) || 'Image';
    input.value = '';
    attachments = [];
    drawAttachments();
    const body = requestBody(model); // before the reply exists: it is not part of the request
    const reply = { role: 'assistant', content: '', reasoning: '' };
    active.messages.push(reply);
    drawList();
    drawMessages();
    const el = messages.lastElementChild;
    const out = el.querySelector('.content');
    const thinking = h('div', { class: 'content reasoning' });
    const fold = h('details', { class: 'reasoning', hidden: true }, h('summary', {}, 'Reasoning'), thinking);
    el.prepend(fold);
    el.classList.add('streaming');
    controller = new AbortController();
    sendButton.hidden = true;
    stopButton.hidden = false;
    let frame = 0;
    const paint = () => {
      frame = 0;
      render(out, reply.content);
      if (reply.reasoning) { fold.hidden = false; render(thinking, reply.reasoning); }
      messages.scrollTop = messages.scrollHeight;
    };
    try {
      const resp = await send('/chat/completions', { method: 'POST', body, signal: controller.signal });
      for await (const { event, data } of events(resp)) {
        if (data === '[DONE]') break;
        if (event === 'error' || data?.error) throw new Error(data.error?.message || data.error || 'The engine reported an error');
        const delta = data?.choices?.[0]?.delta || {};
        reply.content += delta.content || '';
        reply.reasoning += delta.reasoning_content || '';
        if (!frame) frame = requestAnimationFrame(paint);
      }
    } catch (err) {
      if (err.name !== 'AbortError') reply.error = err.message;
      else reply.stopped = true;
    } finally {
      controller = null;
      sendButton.hidden = false;
      stopButton.hidden = true;
      if (frame) cancelAnimationFrame(frame);
      paint();
    }
    if (!reply.error) {
      try {
        const s = await call('/stats');
        reply.stats = [s.tokens_per_second != null ? `${Number(s.tokens_per_second).toFixed(1)} tokens/s` : null,
          s.time_to_first_token != null ? `first token ${Number(s.time_to_first_token).toFixed(2)} s` : null,
          s.output_tokens != null ? `${s.output_tokens} tokens` : null,
          reply.stopped ? 'stopped' : null].filter(Boolean).join(' · ');
      } catch { /* stats are a nicety */ }
    }
    if (!reply.reasoning) delete reply.reasoning;
    persist();
    el.replaceWith(messageView(reply));
    messages.scrollTop = messages.scrollHeight;
    refreshHealth().catch(() => {});
  }

  subscribe(drawPicker);
  draw();
  return { show: () => { drawPicker(); input.focus(); } };
}
