// The microphone's tap, an AudioWorklet (speech.js): it runs on the audio thread and posts the page
// every CHUNK frames it hears. Messages wait while the page is busy, so a busy page sends its audio
// late but whole; the ScriptProcessor it replaces ran on the page's thread and dropped the blocks the
// page was too busy to take (2.5 s of a busy page lost the sentence's first words).
const CHUNK = 4096; // about 85 ms at 48 kHz: one WebSocket message each

class MicTap extends AudioWorkletProcessor {
  constructor() {
    super();
    this.chunk = new Float32Array(CHUNK);
    this.filled = 0;
  }

  process(inputs) {
    const samples = inputs[0]?.[0]; // mono: the first channel of the first input
    if (!samples) return true;
    for (let i = 0; i < samples.length;) {
      const n = Math.min(samples.length - i, CHUNK - this.filled);
      this.chunk.set(samples.subarray(i, i + n), this.filled);
      this.filled += n;
      i += n;
      if (this.filled === CHUNK) {
        this.port.postMessage(this.chunk, [this.chunk.buffer]); // handed over, not copied
        this.chunk = new Float32Array(CHUNK);
        this.filled = 0;
      }
    }
    return true; // keep running while the microphone is connected
  }
}

registerProcessor('mic-tap', MicTap);
