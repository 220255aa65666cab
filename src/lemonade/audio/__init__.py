"""Audio facts the server needs without decoding audio itself: which container a file is (read from
its first bytes, so a bad upload is refused before a model loads), WAV framing for raw PCM16, and
the energy VAD of the realtime transcription API. Decoding and resampling happen in the engine."""
