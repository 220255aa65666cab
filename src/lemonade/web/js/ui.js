// Small DOM helpers shared by the views.

/** h('button', {class: 'x', onclick: f}, 'text', child) -> element */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value' || (k in el && typeof v !== 'string')) el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el, ...children) { el.replaceChildren(...children.flat().filter(Boolean)); return el; }

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${units[i]}`;
}

export function toast(message, kind = 'info') {
  const el = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, message);
  document.getElementById('toasts').append(el);
  setTimeout(() => el.remove(), kind === 'error' ? 8000 : 4000);
}

/** Run an async action from a button: disabled while it runs, errors shown as a toast. */
export async function busy(button, action) {
  if (button) button.disabled = true;
  try { return await action(); } catch (err) { toast(err.message || String(err), 'error'); return undefined; }
  finally { if (button) button.disabled = false; }
}

export function progressBar(label) {
  const bar = h('progress', { max: 100, value: 0, 'aria-label': label });
  const text = h('span', { class: 'progress-text' }, '0%');
  const wrap = h('div', { class: 'progress' }, bar, text);
  wrap.set = (percent, detail = '') => {
    const p = Math.max(0, Math.min(100, Math.round(percent || 0)));
    bar.value = p;
    text.textContent = `${p}%${detail ? ' · ' + detail : ''}`;
  };
  return wrap;
}

/** A label/control pair. */
export function field(label, control, hint) {
  return h('label', { class: 'field' }, h('span', {}, label), control, hint ? h('small', { class: 'hint' }, hint) : null);
}

export function badge(text, kind = '') { return h('span', { class: `badge ${kind}` }, text); }
