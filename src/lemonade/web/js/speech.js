// Speech: transcribe a WAV file (/v1/audio/transcriptions) or the microphone (/v1/realtime), and
// speak text (/v1/audio/speech). Each part is shown only when a model of its type is downloaded.
//
// The microphone is read at the device's rate and resampled here to what /v1/realtime takes: 16 kHz
// mono PCM16, base64 in `input_audio_buffer.append`. The server's VAD cuts turns; its interim
// `...transcription.delta` carries the whole turn so far (it replaces the last one), `...completed`
// the final text. The key travels as the WebSocket subprotocol (api.js `socket`).
import { ApiError, checkKey, call, send, socket } from './api.js';
import { downloadedOf, subscribe } from './state.js';
import { busy, clear, field, h, toast } from './ui.js';

const RATE = 16000;
const MIC_TAP = new URL('./mic-tap.js', import.meta.url); // the AudioWorklet that reads the microphone
// Every model takes OpenAI's voice names (mapped onto its own voices); its own names work too.
const OPENAI_VOICES = ['alloy', 'ash', 'ballad', 'coral', 'echo', 'fable', 'onyx', 'nova', 'sage', 'shimmer', 'verse',
  'marin', 'cedar'];
const TRANSCRIPTION = 'conversation.item.input_audio_transcription';

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

/** Float samples at `from` Hz -> PCM16 at 16 kHz (averaging each output sample's span: a cheap
 * low-pass, enough for speech). `state.pos` carries the fractional position across calls. */
function toPcm16(f32, from, state) {
  const step = from / RATE;
  const out = new Int16Array(Math.max(0, Math.floor((f32.length - state.pos) / step)));
  let pos = state.pos;
  for (let i = 0; i < out.length; i++, pos += step) {
    const start = Math.floor(pos);
    const end = Math.max(start + 1, Math.min(f32.length, Math.floor(pos + step)));
    let sum = 0;
    for (let j = start; j < end; j++) sum += f32[j];
    out[i] = Math.max(-1, Math.min(1, sum / (end - start))) * 0x7fff;
  }
  state.pos = pos - f32.length;
  return out;
}

/** The request field a 400 names ("Invalid value for 'voice': ..."), if any. */
function fieldOf(err) {
  const param = err.body?.error?.param;
  if (typeof param === 'string') return param;
  return /(?:for|field) '([a-z_]+)'/.exec(err.message)?.[1] ?? null;
}

export function create(root) {
  const sttModel = modelSelect('stt-model', 'Transcription model');
  const file = h('input', { type: 'file', accept: 'audio/wav,.wav', id: 'stt-file', 'aria-label': 'Audio file (WAV)' });
  const transcript = h('div', { class: 'transcript', id: 'transcript', 'aria-live': 'polite' });
  const micButton = h('button', { type: 'button', id: 'mic', 'aria-pressed': 'false' }, 'Start microphone');
  const micState = h('span', { class: 'hint', id: 'mic-state', 'aria-live': 'polite' });
  const stt = h('section', { class: 'panel', id: 'stt' }, h('h2', {}, 'Transcribe'),
    field('Model', sttModel),
    h('form', { class: 'row wrap', onsubmit: (e) => { e.preventDefault(); transcribe(e.submitter); } },
      file, h('button', { type: 'submit', class: 'primary' }, 'Transcribe file')),
    h('div', { class: 'row' }, micButton, micState, h('small', { class: 'hint' }, 'Live transcription over /v1/realtime')),
    transcript);

  const ttsModel = modelSelect('tts-model', 'Speech model');
  const ttsText = h('textarea', { rows: 3, id: 'tts-text', 'aria-label': 'Text to speak', placeholder: 'Text to speak' });
  const voice = h('input', { type: 'text', id: 'tts-voice', list: 'tts-voices', placeholder: 'default voice',
    'aria-label': 'Voice' });
  const voices = h('datalist', { id: 'tts-voices' }, OPENAI_VOICES.map((v) => h('option', { value: v })));
  const speed = h('input', { type: 'number', id: 'tts-speed', min: 0.25, max: 4, step: 0.05, value: '1',
    'aria-label': 'Speed' });
  const ttsError = h('p', { class: 'error', id: 'tts-error', role: 'alert', hidden: true });
  const audio = h('audio', { controls: true, hidden: true, id: 'tts-audio', 'aria-label': 'Spoken text' });
  const speakButton = h('button', { class: 'primary', onclick: (e) => busy(e.target, speak) }, 'Speak');
  const tts = h('section', { class: 'panel', id: 'tts' }, h('h2', {}, 'Speak'),
    field('Model', ttsModel), ttsText,
    h('div', { class: 'row wrap top' }, field('Voice', voice, 'an OpenAI name or one of the model\'s voices'),
      field('Speed', speed)), voices,
    h('div', { class: 'row' }, speakButton, h('small', { class: 'hint', id: 'tts-state', 'aria-live': 'polite' })),
    ttsError, audio);

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

  function showTtsError(message, control) {
    for (const c of [ttsText, voice, speed]) c.removeAttribute('aria-invalid');
    ttsError.textContent = message || '';
    ttsError.hidden = !message;
    if (control) control.setAttribute('aria-invalid', 'true');
  }

  async function speak() {
    const state = document.getElementById('tts-state');
    if (!ttsText.value.trim()) { showTtsError('Type some text to speak first.', ttsText); return; }
    showTtsError('');
    // wav: every TTS engine encodes it and every browser plays it (a model is loaded on first use)
    const body = { model: ttsModel.value, input: ttsText.value, response_format: 'wav', speed: Number(speed.value) || 1 };
    if (voice.value.trim()) body.voice = voice.value.trim();
    state.textContent = 'Speaking…';
    try {
      const resp = await send('/audio/speech', { method: 'POST', body });
      const blob = await resp.blob();
      if (audio.src) URL.revokeObjectURL(audio.src);
      audio.src = URL.createObjectURL(blob);
      audio.hidden = false;
      audio.play().catch(() => {}); // a browser may refuse to autoplay; the controls are there
    } catch (err) {
      if (!(err instanceof ApiError) || err.status >= 500) throw err; // busy() shows it
      const name = fieldOf(err);
      showTtsError(err.message, { input: ttsText, voice, speed }[name]);
    } finally {
      state.textContent = '';
    }
  }

  // ----- microphone: /v1/realtime ------------------------------------------------------------------
  let mic = null;
  micButton.addEventListener('click', () => (mic ? stopMic() : startMic().catch((err) => {
    toast(err.message || String(err), 'error');
    stopMic();
  })));

  async function startMic() {
    if (!navigator.mediaDevices?.getUserMedia) {
      // browsers offer the microphone only to secure pages: https, or http on localhost
      throw new Error(`This browser offers no microphone to ${location.origin}: open the app at `
        + `http://localhost:${location.port || 80}/ on this machine, or over https.`);
    }
    await checkKey();
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false } });
    const context = new AudioContext(); // the device's rate; resampled to 16 kHz below
    const source = context.createMediaStreamSource(stream);
    try {
      await context.audioWorklet.addModule(MIC_TAP);
    } catch (err) { // the microphone is not left open behind the error shown
      stream.getTracks().forEach((t) => t.stop());
      context.close().catch(() => {});
      throw err;
    }
    const processor = new AudioWorkletNode(context, 'mic-tap', { numberOfInputs: 1, numberOfOutputs: 1,
      channelCount: 1, channelCountMode: 'explicit' });
    const ws = socket(`/v1/realtime?model=${encodeURIComponent(sttModel.value)}`);
    // pending: turns committed whose text has not come yet; the socket stays open for them at stop.
    // early: audio heard before the socket opened, sent when it opens
    const session = { stream, context, ws, processor, speaking: false, stopping: false, pending: 0, awaitCommit: false,
      early: [] };
    mic = session;
    let partial = h('span', { class: 'partial' });
    transcript.replaceChildren(partial);
    micState.textContent = 'Connecting…';
    ws.onopen = () => {
      micState.textContent = 'Listening';
      session.early.splice(0).forEach((message) => ws.send(message));
    };
    ws.onmessage = (msg) => {
      const data = JSON.parse(msg.data);
      if (data.type === 'input_audio_buffer.speech_started') {
        session.speaking = true;
        micState.textContent = 'Hearing speech…';
      } else if (data.type === 'input_audio_buffer.speech_stopped') {
        session.speaking = false;
        micState.textContent = 'Transcribing…';
      } else if (data.type === 'input_audio_buffer.committed') {
        session.pending++;
        session.awaitCommit = false;
      } else if (data.type === `${TRANSCRIPTION}.delta`) {
        partial.textContent = data.delta; // the whole turn so far: it replaces the previous one
      } else if (data.type === `${TRANSCRIPTION}.completed`) {
        session.pending = Math.max(0, session.pending - 1);
        if (data.transcript) partial.before(h('p', {}, data.transcript));
        partial.textContent = '';
        if (mic === session) micState.textContent = session.speaking ? 'Hearing speech…' : 'Listening';
      } else if (data.type === 'error') {
        if (data.error?.item_id || data.item_id) session.pending = Math.max(0, session.pending - 1);
        // a commit at stop may find too little audio left: not worth a word
        if (!(session.stopping && data.error?.code === 'input_audio_buffer_commit_empty')) {
          toast(data.error?.message || 'realtime error', 'error');
        }
        if (session.stopping) session.awaitCommit = false;
      }
      if (session.stopping) closeWhenDone(session);
    };
    ws.onclose = (e) => {
      if (mic === session) {
        toast(`The realtime connection closed${e.reason ? `: ${e.reason}` : ` (code ${e.code})`}`, 'error');
        stopMic();
      }
      micState.textContent = '';
    };
    const resample = { pos: 0 };
    processor.port.onmessage = (e) => {
      if (ws.readyState > WebSocket.OPEN) return; // closing: the microphone was stopped
      const pcm = toPcm16(e.data, context.sampleRate, resample);
      if (!pcm.length) return;
      const message = JSON.stringify({ type: 'input_audio_buffer.append', audio: base64(pcm) });
      if (ws.readyState === WebSocket.OPEN) ws.send(message);
      else session.early.push(message);
    };
    source.connect(processor);
    processor.connect(context.destination); // pulled by the graph only when connected; it outputs silence
    await context.resume();
    micButton.textContent = 'Stop microphone';
    micButton.setAttribute('aria-pressed', 'true');
  }

  function stopMic() {
    if (!mic) return;
    const session = mic;
    const { stream, context, ws, processor } = session;
    mic = null;
    session.stopping = true;
    processor.disconnect();
    processor.port.onmessage = null;
    stream.getTracks().forEach((t) => t.stop());
    context.close().catch(() => {});
    // a turn still being spoken is committed; the socket closes once every turn's text has come
    if (ws.readyState === WebSocket.OPEN && session.speaking) {
      ws.send(JSON.stringify({ type: 'input_audio_buffer.commit' }));
      session.awaitCommit = true;
    }
    closeWhenDone(session);
    setTimeout(() => ws.close(), 60000);
    micButton.textContent = 'Start microphone';
    micButton.setAttribute('aria-pressed', 'false');
  }

  function closeWhenDone(session) {
    if (session.ws.readyState !== WebSocket.OPEN || (!session.awaitCommit && session.pending === 0)) {
      session.ws.close();
      micState.textContent = '';
    } else {
      micState.textContent = 'Transcribing…';
    }
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
