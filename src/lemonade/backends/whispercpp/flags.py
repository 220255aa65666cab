"""Which whisper-server flags a user may pass in `whispercpp_args`.

Taken from the pinned whisper.cpp v1.8.5 `examples/server/server.cpp` argument parser.
whisper-server prints its usage and exits with status 0 on an unknown flag, so an unknown flag
would make every load of the model fail obscurely: every flag is checked against the pinned
parser's list before a process starts.

- Per request or per model (any API key holder): only flags that touch neither files nor the
  network (threads, decoding, thresholds, timestamps, output flags).
- Server-wide `whispercpp.args` (the admin's): any flag the pinned server knows, but not the ones
  Lemonade sets itself.
"""

from __future__ import annotations

from lemonade.backends.engine import check_native_args
from lemonade.backends.whispercpp.install import WHISPER_CPP_VERSION

# Lemonade sets these itself (lemonade.md: -m, --model, --port; we also bind the host and rely on
# the inference path).
FORBIDDEN_FLAGS = {
    "-m": "-m", "--model": "-m", "--port": "--port", "--host": "--host",
    "--inference-path": "the inference path", "--request-path": "the request path",
}

# Decoding, threads, thresholds and output: none reads or writes a file or opens a connection.
SAFE_FLAGS = frozenset("""
-t --threads -p --processors -ot --offset-t -on --offset-n -d --duration -mc --max-context -ml --max-len
-bo --best-of -bs --beam-size -ac --audio-ctx -wt --word-thold -et --entropy-thold -lpt --logprob-thold
-tr --translate -di --diarize -tdrz --tinydiarize -sow --split-on-word -nf --no-fallback -ps --print-special
-pc --print-colors -pr --print-realtime -pp --print-progress -nt --no-timestamps -l --language
-dl --detect-language --prompt --carry-initial-prompt -dtw --dtw -ng --no-gpu -dev --device -fa --flash-attn
-nfa --no-flash-attn -sns --suppress-nst -nth --no-speech-thold -nlp --no-language-probabilities
-vt --vad-threshold -vspd --vad-min-speech-duration-ms -vsd --vad-min-silence-duration-ms
-vmsd --vad-max-speech-duration-s -vp --vad-speech-pad-ms -vo --vad-samples-overlap
""".split())

# Everything else the pinned parser knows: files (--public serves a folder, -fp a font, -vm a VAD
# model, --tmp-dir, -debug dumps the log-mel to a file, -oved an OpenVINO encoder next to the
# model), programs (--convert runs ffmpeg), and --vad (loads its model file). -h/--help is no
# flag to run with (it prints the usage and exits).
ADMIN_ONLY_FLAGS = frozenset("""
-debug --debug-mode -fp --font-path -oved --ov-e-device --public --convert --tmp-dir --vad -vm --vad-model
""".split())

KNOWN_FLAGS = SAFE_FLAGS | ADMIN_ONLY_FLAGS | frozenset(FORBIDDEN_FLAGS)


def check_whispercpp_args(text: str, *, trusted: bool = False) -> list[str]:
    """Tokenise `whispercpp_args`; ValueError naming the first flag that is not allowed (`trusted`:
    the admin's server-wide setting) or that whisper-server does not know."""
    return check_native_args(text, trusted=trusted, forbidden=FORBIDDEN_FLAGS, safe=SAFE_FLAGS, known=KNOWN_FLAGS,
                             program=f"whisper-server (whisper.cpp {WHISPER_CPP_VERSION})",
                             option="whispercpp_args", config_key="whispercpp.args",
                             examples="threads, beam size, thresholds, timestamps, ...")
