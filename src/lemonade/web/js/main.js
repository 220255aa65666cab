// The app shell: one view per tab (created once, kept while hidden, so a reply keeps streaming and
// logs keep arriving), the status line, and which optional tabs exist.
import { refresh, refreshHealth, state, subscribe, downloadedOf } from './state.js';
import { h, toast } from './ui.js';

const VIEWS = {
  chat: () => import('./chat.js'),
  models: () => import('./models.js'),
  backends: () => import('./backends.js'),
  logs: () => import('./logs.js'),
  speech: () => import('./speech.js'),
  images: () => import('./images.js'),
};
const mounted = {};
const mounting = {};
let current = null;
let wanted = null;

function tabLink(name) { return document.querySelector(`.tabs a[data-view="${name}"]`); }

/** Speech and Images appear only when a model of that type is downloaded. */
function optionalTabs() {
  const speech = downloadedOf('transcription').length + downloadedOf('tts').length > 0;
  const images = downloadedOf('image').length > 0;
  tabLink('speech').hidden = !speech;
  tabLink('images').hidden = !images;
}

/** One mount per view even when two routes ask for it while its module is still loading. */
function mount(name) {
  mounting[name] ??= (async () => {
    const container = h('section', { class: `view view-${name}`, 'aria-label': name, hidden: true });
    document.getElementById('view').append(container);
    const module = await VIEWS[name]();
    mounted[name] = { container, view: module.create(container) };
  })();
  return mounting[name];
}

async function show(name) {
  if (!VIEWS[name] || tabLink(name).hidden) name = 'chat';
  wanted = name;
  for (const a of document.querySelectorAll('.tabs a')) {
    if (a.dataset.view === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  await mount(name);
  // Views load at their own pace: a tab clicked while an earlier one was loading wins.
  if (wanted !== name) return;
  for (const [n, m] of Object.entries(mounted)) {
    m.container.hidden = n !== name;
    if (n !== name && n === current) m.view.hide?.();
  }
  current = name;
  mounted[name].view.show?.();
  document.title = `Lemonade · ${name[0].toUpperCase()}${name.slice(1)}`;
}

function statusLine() {
  const el = document.getElementById('status');
  const loaded = state.health?.all_models_loaded || [];
  const sys = state.system;
  const parts = [loaded.length ? `${loaded.length} loaded` : 'no model loaded'];
  if (sys) parts.push(`CPU ${Math.round(sys.cpu_percent)}%`, `RAM ${sys.memory_gb} GB`);
  el.textContent = parts.join(' · ');
  el.title = loaded.map((m) => m.model_name).join(', ');
}

function route() { show((location.hash.replace(/^#\/?/, '').split('/')[0]) || 'chat'); }

subscribe(() => { optionalTabs(); statusLine(); });
window.addEventListener('hashchange', route);
refresh().then(route).catch((err) => { toast(err.message, 'error'); route(); });
setInterval(() => { if (!document.hidden) refreshHealth().catch(() => {}); }, 5000);
