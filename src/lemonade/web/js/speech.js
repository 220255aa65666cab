// Speech: transcribe a WAV file (/v1/audio/transcriptions) or the microphone (/v1/realtime,
// 16 kHz mono PCM16 in base64 chunks), and speak text (/v1/audio/speech). Each part is shown only
// when a model of its type is downloaded.
import { apiKey, call, checkKey, send } from './api.js';
import { downloadedOf, subscribe } from './state.js';
import { busy, clear, field, h, toast } from './ui.js';

const RATE = 16000;
const CHUNK_SAMPLES = 4096; // about 256 ms at 16 kHz

function modelSelect(id, label) {
  return h('select', { id, 'aria-label': label });
}

function fill(select, models) {
  const current = select.value;
  clear(select, models.map((m) => h('option', { value: m.id }, m.id)));
  if (models.some((m) => m.id === current)) select.value = current;
}

function base64(int16) {
  const bytes = new Uint8Array(int16.buffer);
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

export function create(root) {
  const sttModel = modelSelect('stt-model', 'Transcription model');
  const file = h('input', { type: 'file', accept: 'audio/wav,.wav', id: 'stt-file', 'aria-label': 'Audio file (WAV)' });
  const transcript = h('div', { class: 'transcript', id: 'transcript', 'aria-live': 'polite' });
  const micButton = h('button', { type: 'button', id: 'mic', 'aria-pressed': 'false' }, 'Start microphone');
  const stt = h('section', { class: 'panel', id: 'stt' }, h('h2', {}, 'Transcribe'),
    field('Model', sttModel),
    h('form', { class: 'row wrap', onsubmit: (e) => { e.preventDefault(); transcribe(e.submitter); } },
      file, h('button', { type: 'submit', class: 'primary' }, 'Transcribe file')),
    h('div', { class: 'row' }, micButton, h('small', { class: 'hint' }, 'Live transcription over /v1/realtime')),
    transcript);

  const ttsModel = modelSelect('tts-model', 'Speech model');
  const ttsText = h('textarea', { rows: 3, id: 'tts-text', 'aria-label': 'Text to speak', placeholder: 'Text to speak' });
  const voice = h('input', { type: 'text', id: 'tts-voice', placeholder: 'default voice', 'aria-label': 'Voice' });
  const audio = h('audio', { controls: true, hidden: true, id: 'tts-audio' });
  const tts = h('section', { class: 'panel', id: 'tts' }, h('h2', {}, 'Speak'),
    field('Model', ttsModel), ttsText, field('Voice', voice),
    h('button', { class: 'primary', onclick: (e) => busy(e.target, speak) }, 'Speak'), audio);

  root.append(stt, tts);

  async function transcribe(button) {
    if (!file.files.length) { toast('Choose a WAV file first.', 'error'); return; }
    await busy(button, async () => {
      const form = new FormData();
      form.append('file', file.files[0]);
      form.append('model', sttModel.value);
      transcript.textContent = 'Transcribing…';
      const result = await call('/audio/transcriptions', { method: 'POST', body: form });
      transcript.textContent = result.text ?? String(result);
    });
    if (transcript.textContent === 'Transcribing…') transcript.textContent = '';
  }

  async function speak() {
    const body = { model: ttsModel.value, input: ttsText.value, response_format: 'wav' };
    if (voice.value.trim()) body.voice = voice.value.trim();
    const resp = await send('/audio/speech', { method: 'POST', body });
    const blob = await resp.blob();
    if (audio.src) URL.revokeObjectURL(audio.src);
    audio.src = URL.createObjectURL(blob);
    audio.hidden = false;
    audio.play().catch(() => {});
  }

  // ----- microphone: /v1/realtime ------------------------------------------------------------------
  let mic = null;
  micButton.addEventListener('click', () => (mic ? stopMic() : startMic().catch((err) => { toast(err.message, 'error'); stopMic(); })));

  async function startMic() {
    await checkKey();
    const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    const context = new AudioContext({ sampleRate: RATE });
    const source = context.createMediaStreamSource(stream);
    const processor = context.createScriptProcessor(CHUNK_SAMPLES, 1, 1);
    const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const key = apiKey();
    const ws = new WebSocket(`${scheme}//${location.host}/v1/realtime?model=${encodeURIComponent(sttModel.value)}`,
      key ? [`openai-insecure-api-key.${key}`] : []);
    let partial = h('span', { class: 'partial' });
    transcript.replaceChildren(partial);
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.type === 'conversation.item.input_audio_transcription.delta') partial.textContent = data.delta ?? data.transcript ?? '';
      else if (data.type === 'conversation.item.input_audio_transcription.completed') {
        partial.replaceWith(h('p', {}, data.transcript));
        partial = h('span', { class: 'partial' });
        transcript.append(partial);
      } else if (data.type === 'error') toast(data.error?.message || data.message || 'realtime error', 'error');
    };
    ws.onclose = () => { if (mic) stopMic(); };
    processor.onaudioprocess = (e) => {
      if (ws.readyState !== WebSocket.OPEN) return;
      const f32 = e.inputBuffer.getChannelData(0);
      const pcm = new Int16Array(f32.length);
      for (let i = 0; i < f32.length; i++) pcm[i] = Math.max(-1, Math.min(1, f32[i])) * 0x7fff;
      ws.send(JSON.stringify({ type: 'input_audio_buffer.append', audio: base64(pcm) }));
    };
    source.connect(processor);
    processor.connect(context.destination);
    mic = { stream, context, ws, processor };
    micButton.textContent = 'Stop microphone';
    micButton.setAttribute('aria-pressed', 'true');
  }

  function stopMic() {
    if (!mic) return;
    const { stream, context, ws, processor } = mic;
    mic = null;
    processor.disconnect();
    stream.getTracks().forEach((t) => t.stop());
    context.close();
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'input_audio_buffer.commit' }));
    setTimeout(() => ws.close(), 1500);
    micButton.textContent = 'Start microphone';
    micButton.setAttribute('aria-pressed', 'false');
  }

  function draw() {
    const sttModels = downloadedOf('transcription');
    const ttsModels = downloadedOf('tts');
    stt.hidden = !sttModels.length;
    tts.hidden = !ttsModels.length;
    fill(sttModel, sttModels);
    fill(ttsModel, ttsModels);
  }
  subscribe(draw);
  draw();
  return {};
}
