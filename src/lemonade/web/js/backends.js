// Engines and their backends (/v1/system-info `recipes`): state, version, install with streamed
// progress (/v1/install), uninstall (/v1/uninstall).
import { call } from './api.js';
import { streamed } from './progress.js';
import { badge, busy, clear, h, progressBar, toast } from './ui.js';

const STATE_KIND = { installed: 'ok', installable: '', update_required: 'warn', unsupported: 'muted' };

export function create(root) {
  const box = h('div', { class: 'table-wrap', id: 'backends' });
  root.append(h('h2', {}, 'Backends'),
    h('p', { class: 'hint' }, 'Each model runs in an engine process. A missing backend is also installed the first time a model needs it.'),
    box);

  async function draw() {
    const info = await call('/system-info');
    const rows = [];
    for (const [recipe, r] of Object.entries(info.recipes || {})) {
      for (const [backend, b] of Object.entries(r.backends || {})) rows.push({ recipe, backend, ...b });
    }
    clear(box, h('table', {},
      h('thead', {}, h('tr', {}, ['Engine', 'Backend', 'State', 'Version', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, rows.map((b) => {
        const bar = progressBar(`Installing ${b.recipe}:${b.backend}`);
        bar.hidden = true;
        const install = async () => {
          bar.hidden = false;
          await streamed('/install', { recipe: b.recipe, backend: b.backend }, (p, text) => bar.set(p ?? 0, text));
          toast(`Installed ${b.recipe}:${b.backend}`);
          await draw();
        };
        return h('tr', { dataset: { backend: `${b.recipe}:${b.backend}` } },
          h('td', {}, b.recipe), h('td', {}, b.backend),
          h('td', {}, badge(b.state, STATE_KIND[b.state] ?? ''), b.message ? h('small', { class: 'hint block' }, b.message) : null),
          h('td', {}, b.version || ''),
          h('td', { class: 'actions' },
            ['installable', 'update_required'].includes(b.state)
              ? h('button', { onclick: (e) => busy(e.target, install) }, b.state === 'installable' ? 'Install' : 'Update') : null,
            b.state === 'installed' ? h('button', { class: 'danger', onclick: (e) => busy(e.target, async () => {
              if (!confirm(`Uninstall ${b.recipe}:${b.backend}? Its loaded models are unloaded.`)) return;
              await call('/uninstall', { method: 'POST', body: { recipe: b.recipe, backend: b.backend } });
              toast(`Uninstalled ${b.recipe}:${b.backend}`);
              await draw();
            }) }, 'Uninstall') : null,
            bar));
      }))));
  }

  return { show: () => draw().catch((err) => toast(err.message, 'error')) };
}
