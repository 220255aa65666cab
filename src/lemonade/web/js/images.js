// Images: generate (/v1/images/generations) and upscale (/v1/images/upscale). The tab appears only
// when an image model is downloaded; upscaling needs a model labelled `upscaling`.
import { call } from './api.js';
import { downloadedOf, subscribe } from './state.js';
import { busy, clear, field, h } from './ui.js';

export function create(root) {
  const model = h('select', { id: 'image-model', 'aria-label': 'Image model' });
  const upscaler = h('select', { id: 'upscale-model', 'aria-label': 'Upscaling model' });
  const prompt = h('textarea', { rows: 3, id: 'image-prompt', 'aria-label': 'Prompt', placeholder: 'A serene mountain landscape at sunset' });
  // Model default: the size the model is registered with (its image_defaults; 512x512 otherwise)
  const size = h('select', { 'aria-label': 'Size' }, h('option', { value: '' }, 'Model default'),
    ['512x512', '256x256', '768x768', '1024x1024'].map((s) => h('option', { value: s }, s)));
  const steps = h('input', { type: 'number', min: 1, max: 150, placeholder: 'model default', 'aria-label': 'Steps' });
  const seed = h('input', { type: 'number', placeholder: 'random', 'aria-label': 'Seed' });
  const result = h('figure', { class: 'image-result', id: 'image-result' });
  const upscaleRow = h('div', { class: 'row wrap' }, field('Upscaler', upscaler),
    h('button', { onclick: (e) => busy(e.target, upscale) }, 'Upscale 4×'));
  let last = null;

  root.append(h('section', { class: 'panel' }, h('h2', {}, 'Generate an image'),
    field('Model', model), field('Prompt', prompt),
    h('div', { class: 'row wrap' }, field('Size', size), field('Steps', steps), field('Seed', seed)),
    h('button', { class: 'primary', onclick: (e) => busy(e.target, generate) }, 'Generate'),
    h('p', { class: 'hint' }, 'On a CPU an image takes minutes.'), upscaleRow, result));

  function showImage(b64, caption) {
    last = b64;
    clear(result, h('img', { src: `data:image/png;base64,${b64}`, alt: caption }), h('figcaption', {}, caption));
    upscaleRow.hidden = !downloadedOf('upscaling').length;
  }

  async function generate() {
    const body = { model: model.value, prompt: prompt.value, n: 1, response_format: 'b64_json' };
    if (size.value) body.size = size.value;
    if (steps.value) body.steps = Number(steps.value);
    if (seed.value) body.seed = Number(seed.value);
    clear(result, h('p', { class: 'hint' }, 'Generating…'));
    const out = await call('/images/generations', { method: 'POST', body });
    showImage(out.data[0].b64_json, prompt.value);
  }

  async function upscale() {
    if (!last) return;
    const out = await call('/images/upscale', { method: 'POST', body: { image: last, model: upscaler.value } });
    showImage(out.data[0].b64_json, 'Upscaled 4×');
  }

  function draw() {
    const fillSelect = (select, list) => { const v = select.value; clear(select, list.map((m) => h('option', { value: m.id }, m.id))); if (list.some((m) => m.id === v)) select.value = v; };
    fillSelect(model, downloadedOf('image'));
    fillSelect(upscaler, downloadedOf('upscaling'));
    upscaleRow.hidden = !last || !downloadedOf('upscaling').length;
  }
  subscribe(draw);
  draw();
  return {};
}
