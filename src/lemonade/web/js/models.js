// Model manager: what is loaded now (load options, pin, unload), server-owned downloads (pull with
// live progress, pause/resume/cancel, surviving a reload), the catalog (filter, search, download,
// delete) and registry search with variants.
import { call } from './api.js';
import { streamed } from './progress.js';
import { kindOf, loaded, refresh, refreshHealth, refreshModels, state, subscribe } from './state.js';
import { badge, busy, bytes, clear, field, h, progressBar, toast } from './ui.js';

const DOWNLOAD_POLL_MS = 700;

export function create(root) {
  const loadedBox = h('div', { class: 'card-list', id: 'loaded-models' });
  const jobsBox = h('div', { class: 'card-list', id: 'downloads' });
  const catalogBox = h('div', { class: 'table-wrap' });
  const filterText = h('input', { type: 'search', placeholder: 'Filter by name or label', 'aria-label': 'Filter models', oninput: drawCatalog });
  const filterState = h('select', { 'aria-label': 'Which models', onchange: drawCatalog },
    h('option', { value: 'all' }, 'All models'), h('option', { value: 'downloaded' }, 'Downloaded'),
    h('option', { value: 'available' }, 'Not downloaded'));
  const filterKind = h('select', { 'aria-label': 'Model type', onchange: drawCatalog },
    ['all', 'chat', 'embeddings', 'reranking', 'transcription', 'tts', 'image', 'upscaling'].map((k) => h('option', { value: k }, k === 'all' ? 'Every type' : k)));
  const searchText = h('input', { type: 'search', placeholder: 'Search Hugging Face, e.g. Qwen3 GGUF', 'aria-label': 'Registry search', minlength: 3 });
  const searchSource = h('select', { 'aria-label': 'Registry' }, h('option', { value: 'huggingface' }, 'Hugging Face'), h('option', { value: 'modelscope' }, 'ModelScope'));
  const searchResults = h('div', { class: 'card-list', id: 'search-results' });
  const memory = h('p', { class: 'hint', id: 'memory' });
  let jobs = [];
  let pollTimer = null;
  let visible = false;

  root.append(
    h('h2', {}, 'Loaded now'), memory, loadedBox,
    h('h2', {}, 'Downloads'), jobsBox,
    h('h2', {}, 'Models'),
    h('div', { class: 'row wrap toolbar' }, filterText, filterState, filterKind),
    catalogBox,
    h('h2', {}, 'Find more models'),
    h('form', { class: 'row wrap toolbar', onsubmit: (e) => { e.preventDefault(); search(e.submitter); } },
      searchText, searchSource, h('button', { type: 'submit' }, 'Search')),
    searchResults);

  // ----- loaded models ---------------------------------------------------------------------------
  function drawLoaded() {
    const sys = state.system;
    memory.textContent = sys ? `Memory in use: ${sys.memory_gb} GB · CPU ${Math.round(sys.cpu_percent)}%` : '';
    const items = loaded();
    clear(loadedBox, items.length ? items.map((m) => h('div', { class: 'card', dataset: { model: m.model_name } },
      h('div', { class: 'card-title' }, h('strong', {}, m.model_name), badge(m.type), badge(m.recipe),
        m.pinned ? badge('pinned', 'accent') : null, m.is_busy ? badge('busy', 'warn') : null),
      h('div', { class: 'hint' }, [m.backend && `backend ${m.backend}`, contextOf(m) && `context ${contextOf(m)}`,
        m.load_seconds && `loaded in ${m.load_seconds} s`, m.pid && `pid ${m.pid}`].filter(Boolean).join(' · ')),
      h('div', { class: 'row' },
        h('button', { onclick: (e) => busy(e.target, () => pin(m, !m.pinned)) }, m.pinned ? 'Unpin' : 'Pin'),
        h('button', { onclick: (e) => busy(e.target, () => unload(m.model_name)) }, 'Unload'))))
      : h('p', { class: 'empty' }, 'No model is loaded. Load one below, or just chat: a chat request loads its model.'));
  }

  function contextOf(m) {
    const o = m.recipe_options || {};
    return o.resolved_ctx_size || (o.ctx_size > 0 ? o.ctx_size : null);
  }

  async function unload(name) {
    await call('/unload', { method: 'POST', body: { model_name: name } });
    toast(`Unloaded ${name}`);
    await refreshHealth();
  }

  /** Pinning goes through /v1/load (the public API) with the options the model was loaded with,
   * where they differ from what a plain load would use, so the server sees nothing to reload. */
  async function pin(m, pinned) {
    const view = await call(`/models/${encodeURIComponent(m.model_name)}/options`);
    const body = { ...changed(m.recipe_options || {}, view.effective), model_name: m.model_name, pinned };
    await call('/load', { method: 'POST', body });
    toast(`${pinned ? 'Pinned' : 'Unpinned'} ${m.model_name}`);
    await refreshHealth();
  }

  // ----- load dialog with per-model options --------------------------------------------------------
  /** The options of `values` that differ from `base` (and are known to it): what a request must name. */
  function changed(values, base) {
    return Object.fromEntries(Object.entries(values).filter(([k, v]) =>
      k in base && k !== 'model_name' && v !== null && JSON.stringify(v) !== JSON.stringify(base[k])));
  }

  async function loadDialog(model) {
    const view = await call(`/models/${encodeURIComponent(model.id)}/options`);
    // a list option as typed: comma-separated, or a word standing for one (rpc_workers: auto)
    const listValue = (text) => (text.trim().toLowerCase() === 'auto' ? 'auto' : text.split(',').map((v) => v.trim()).filter(Boolean));
    const inputs = {};
    const rows = Object.entries(view.effective).filter(([k]) => k !== 'model_name').map(([key, value]) => {
      const def = view.defaults[key];
      let control;
      if (value === null) { // a tri-state option: unset means "as configured server-wide"
        control = h('select', {}, h('option', { value: '' }, 'server setting'), h('option', { value: 'true' }, 'on'), h('option', { value: 'false' }, 'off'));
      } else if (typeof def === 'boolean' || typeof value === 'boolean') control = h('input', { type: 'checkbox', checked: !!value });
      else if (typeof def === 'number' || typeof value === 'number') control = h('input', { type: 'number', value: String(value ?? ''), step: 'any' });
      else if (Array.isArray(def) || Array.isArray(value)) control = h('input', { type: 'text', value: Array.isArray(value) ? value.join(',') : (value ?? ''), placeholder: 'comma-separated' });
      else control = h('input', { type: 'text', value: value ?? '' });
      const list = Array.isArray(def) || Array.isArray(value); // e.g. rpc_workers: host:port,host:port
      inputs[key] = { control, kind: control.tagName === 'SELECT' ? 'tristate' : list ? 'list' : control.type };
      return field(key, control, key in view.saved ? 'saved for this model' : `default: ${JSON.stringify(def)}`);
    });
    const pinned = h('input', { type: 'checkbox', checked: !!view.saved.pinned });
    const remember = h('input', { type: 'checkbox' });
    const bar = progressBar(`Loading ${model.id}`);
    bar.hidden = true;
    const values = () => Object.fromEntries(Object.entries(inputs).map(([k, { control, kind }]) =>
      [k, kind === 'checkbox' ? control.checked : kind === 'tristate' ? (control.value === '' ? null : control.value === 'true')
        : kind === 'number' ? (control.value === '' ? null : Number(control.value))
        : kind === 'list' ? listValue(control.value) : control.value]));
    const dialog = h('dialog', { class: 'options-dialog', 'aria-label': `Load ${model.id}` },
      h('form', { method: 'dialog' },
        h('h2', {}, `Load ${model.id}`),
        h('div', { class: 'grid' }, rows),
        h('label', { class: 'check' }, pinned, ' Pin (never evicted to make room)'),
        h('label', { class: 'check' }, remember, ' Save these options for this model'),
        bar,
        h('div', { class: 'row end' },
          h('button', { type: 'button', onclick: (e) => busy(e.target, async () => {
            await call(`/models/${encodeURIComponent(model.id)}/options`, { method: 'DELETE' });
            toast(`Options of ${model.id} reset`); dialog.close();
          }) }, 'Reset saved'),
          h('button', { value: 'cancel' }, 'Close'),
          h('button', { type: 'button', class: 'primary', onclick: (e) => busy(e.target, async () => {
            bar.hidden = false;
            const body = { ...changed(values(), view.effective), model_name: model.id, pinned: pinned.checked, save_options: remember.checked };
            await streamed('/load', body, (p, text) => bar.set(p ?? 0, text));
            toast(`Loaded ${model.id}`);
            dialog.close();
            await refresh();
          }) }, 'Load'))));
    dialog.addEventListener('close', () => dialog.remove());
    document.body.append(dialog);
    dialog.showModal();
  }

  // ----- downloads (server-owned jobs) -------------------------------------------------------------
  async function pull(name, register) {
    const job = await call('/pull', { method: 'POST', body: { model_name: name, ...register, stream: true, subscribe: false } });
    jobs = [job, ...jobs.filter((j) => j.id !== job.id)];
    drawJobs();
    pollJobs();
  }

  async function control(job, action) {
    await call('/downloads/control', { method: 'POST', body: { id: job.id, action } });
    await pollJobs();
  }

  function drawJobs() {
    clear(jobsBox, jobs.length ? jobs.map((j) => {
      const bar = progressBar(`Download of ${j.model_name}`);
      const total = j.total_download_size;
      bar.set(j.percent, [total ? `${bytes(j.cumulative_bytes_downloaded)} of ${bytes(total)}` : '',
        j.total_files > 1 ? `file ${j.file_index}/${j.total_files}` : ''].filter(Boolean).join(' · '));
      const stopped = !j.running;
      return h('div', { class: `card job ${j.status}`, dataset: { job: j.id, status: j.status } },
        h('div', { class: 'card-title' }, h('strong', {}, j.model_name), badge(j.status, j.status === 'error' ? 'danger' : '')),
        bar,
        j.error ? h('p', { class: 'error', role: 'alert' }, j.error) : null,
        h('div', { class: 'row' },
          j.running && j.status === 'downloading' ? h('button', { onclick: (e) => busy(e.target, () => control(j, 'pause')) }, 'Pause') : null,
          stopped && ['paused', 'cancelled', 'error'].includes(j.status)
            ? h('button', { onclick: (e) => busy(e.target, () => pull(j.model_name, {})) }, 'Resume') : null,
          j.status === 'downloading' || j.status === 'paused' ? h('button', { onclick: (e) => busy(e.target, () => control(j, 'cancel')) }, 'Cancel') : null,
          stopped ? h('button', { onclick: (e) => busy(e.target, () => control(j, 'remove')) }, 'Remove') : null));
    }) : h('p', { class: 'empty' }, 'No downloads.'));
  }

  async function pollJobs() {
    clearTimeout(pollTimer);
    const before = new Set(jobs.filter((j) => j.complete).map((j) => j.id));
    try { jobs = await call('/downloads'); } catch { /* shown on the next poll */ }
    drawJobs();
    if (jobs.some((j) => j.complete && !before.has(j.id))) await refreshModels();
    const active = jobs.some((j) => j.running);
    if (visible || active) pollTimer = setTimeout(pollJobs, active ? DOWNLOAD_POLL_MS : 5000);
  }

  // ----- catalog -----------------------------------------------------------------------------------
  function drawCatalog() {
    const text = filterText.value.trim().toLowerCase();
    const which = filterState.value;
    const kind = filterKind.value;
    const rows = state.models.filter((m) => (which === 'all' || (which === 'downloaded') === !!m.downloaded)
      && (kind === 'all' || kindOf(m) === kind)
      && (!text || m.id.toLowerCase().includes(text) || (m.labels || []).some((l) => l.includes(text))))
      .sort((a, b) => Number(!!b.downloaded) - Number(!!a.downloaded)); // downloaded first, else catalog order
    const live = new Set(loaded().map((m) => m.model_name));
    clear(catalogBox, h('table', { class: 'models', id: 'catalog' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Model'), h('th', {}, 'Labels'), h('th', {}, 'Size'), h('th', {}, 'State'), h('th', {}, h('span', { class: 'sr-only' }, 'Actions')))),
      h('tbody', {}, rows.map((m) => h('tr', { dataset: { model: m.id } },
        h('td', {}, h('span', { class: 'name' }, m.id), h('small', { class: 'hint block' }, m.checkpoint)),
        h('td', {}, (m.labels || []).map((l) => badge(l))),
        h('td', { class: 'nowrap' }, m.size ? `${m.size} GB` : ''),
        h('td', {}, live.has(m.id) ? badge('loaded', 'accent') : m.downloaded ? badge('downloaded', 'ok') : badge('available')),
        h('td', { class: 'actions' },
          m.downloaded
            ? [h('button', { onclick: (e) => busy(e.target, () => loadDialog(m)) }, 'Load…'),
              h('button', { class: 'danger', onclick: (e) => busy(e.target, () => remove(m)) }, 'Delete')]
            : h('button', { onclick: (e) => busy(e.target, () => pull(m.id, {})) }, 'Download')))))));
    if (!rows.length) catalogBox.append(h('p', { class: 'empty' }, 'No model matches.'));
  }

  async function remove(m) {
    if (!confirm(`Delete ${m.id} and its files?`)) return;
    await call('/delete', { method: 'POST', body: { model_name: m.id } });
    toast(`Deleted ${m.id}`);
    await refresh();
  }

  // ----- registry search and variants ---------------------------------------------------------------
  async function search(button) {
    const query = searchText.value.trim();
    if (query.length < 3) { toast('Type at least 3 characters to search.', 'error'); return; }
    await busy(button, async () => {
      const found = await call(`/registry/search?${new URLSearchParams({ query, source: searchSource.value, format: 'gguf' })}`);
      clear(searchResults, found.results.length ? found.results.map((r) => {
        const variants = h('div', { class: 'variants' });
        return h('div', { class: 'card', dataset: { repo: r.repository_id } },
          h('div', { class: 'card-title' }, h('strong', {}, r.repository_id), r.task ? badge(r.task) : null),
          r.description ? h('p', { class: 'hint' }, r.description) : null,
          h('button', { onclick: (e) => busy(e.target, () => showVariants(r, variants)) }, 'Variants'), variants);
      }) : h('p', { class: 'empty' }, 'Nothing found.'));
    });
  }

  async function showVariants(result, box) {
    const info = await call(`/pull/variants?${new URLSearchParams({ checkpoint: result.repository_id, source: result.source })}`);
    clear(box, info.variants.map((v) => h('div', { class: 'row variant' },
      h('span', {}, v.name), h('span', { class: 'hint' }, bytes(v.size_bytes)),
      h('button', { onclick: (e) => busy(e.target, () => pull(`user.${info.suggested_name}-${v.name}`, {
        checkpoint: `${info.checkpoint}:${v.name}`, recipe: info.recipe, source: info.source,
        ...(info.suggested_labels?.length ? { labels: info.suggested_labels } : {}),
        ...(info.mmproj_files?.length ? { mmproj: info.mmproj_files[0] } : {}),
        // One draft model beside it (dflash-*, mtp-*) becomes its draft checkpoint, as `lemonade pull` does.
        ...(info.draft_files?.length === 1 ? { checkpoints: { draft: `${info.checkpoint}:${info.draft_files[0]}` } } : {}),
      })) }, 'Download'))));
    if (!info.variants.length) box.append(h('p', { class: 'empty' }, 'No GGUF variant in this repository.'));
  }

  subscribe(() => { drawLoaded(); drawCatalog(); });
  drawLoaded();
  drawCatalog();
  return {
    show: () => { visible = true; pollJobs(); refresh().catch(() => {}); },
    hide: () => { visible = false; },
  };
}
