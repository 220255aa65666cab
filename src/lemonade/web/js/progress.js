// Long operations streamed as SSE (`/v1/load`, `/v1/install` with stream: true): progress events
// into a progress bar, then `complete` or `error`.
import { events, send } from './api.js';

/** POST `body` to `path` as a stream; calls onProgress(percent, text) and resolves with the
 * `complete` event's data, or throws the `error` event's message. */
export async function streamed(path, body, onProgress) {
  const resp = await send(path, { method: 'POST', body: { ...body, stream: true } });
  let result = null;
  for await (const { event, data } of events(resp)) {
    if (event === 'progress') {
      const pct = data.percent ?? (data.bytes_total ? (100 * data.bytes_downloaded) / data.bytes_total : null);
      onProgress?.(pct, data.message || data.phase || data.file || '');
    } else if (event === 'complete') result = data;
    else if (event === 'error') throw new Error(data.error || data.message || 'failed');
  }
  if (!result) throw new Error('The server closed the stream before the operation finished');
  onProgress?.(100, 'done');
  return result;
}
