// What several views show: the catalog (/v1/models?show_all=true) and what is loaded (/v1/health).
// Views subscribe and call refresh() after they change something.
import { call } from './api.js';

const listeners = new Set();
export const state = { models: [], health: null, system: null };

export function subscribe(fn) { listeners.add(fn); return () => listeners.delete(fn); }
function notify() { for (const fn of listeners) fn(state); }

export async function refreshModels() {
  const body = await call('/models?show_all=true');
  state.models = body.data || [];
  notify();
}

export async function refreshHealth() {
  const [health, system] = await Promise.all([call('/health'), call('/system-stats').catch(() => null)]);
  state.health = health;
  state.system = system;
  notify();
}

export async function refresh() { await Promise.all([refreshModels(), refreshHealth()]); }

export function loaded() { return state.health?.all_models_loaded || []; }

/** Deployment labels other than chat: a model with none of them is a chat model. */
const NOT_CHAT = ['embeddings', 'embedding', 'reranking', 'transcription', 'tts', 'image', 'upscaling',
  'audio-generation', 'classification', '3d'];

export function kindOf(model) {
  const labels = model.labels || [];
  // 'upscaling' before 'image': the catalog's upscalers carry both labels, and they cannot generate
  for (const kind of ['transcription', 'tts', 'upscaling', 'image', 'embeddings', 'embedding', 'reranking']) {
    if (labels.includes(kind)) return kind === 'embedding' ? 'embeddings' : kind;
  }
  return labels.some((l) => NOT_CHAT.includes(l)) ? 'other' : 'chat';
}

/** Downloaded models with a label, e.g. downloadedOf('transcription'). */
export function downloadedOf(kind) { return state.models.filter((m) => m.downloaded && kindOf(m) === kind); }
