"""llama.cpp: turning a model and its resolved options into a `llama-server` command line."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.catalog.models import ModelInfo
from lemonade.runtime.options import FORBIDDEN_LLAMACPP_FLAGS, split_args

AUTO_CTX_CAP = 8192       # automatic context: the model's trained length, capped to keep RAM modest
FALLBACK_CTX = 4096       # when the GGUF does not say
# llama.cpp's built-in templates, for GGUFs that carry none (base models).
TEMPLATE_BY_ARCH = {"gemma3": "gemma", "gemma2": "gemma", "gemma": "gemma", "llama": "llama3",
                    "phi3": "phi3", "mistral": "mistral-v7"}
MTP_ARGS = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.75"]


def resolved_ctx_size(ctx_size: int, main_file: Path | None) -> int:
    if ctx_size != -1:
        return ctx_size
    trained = None
    if main_file is not None:
        try:
            trained = gguf_info(main_file).context_length
        except (OSError, GGUFError):
            trained = None
    return min(trained, AUTO_CTX_CAP) if trained else FALLBACK_CTX


def build_argv(binary: Path, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
               port: int) -> list[str]:
    main = files["main"][0]
    argv = [str(binary), "-m", str(main), "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(resolved_ctx_size(options.get("ctx_size", -1), main)),
            "--alias", model.name, "--metrics", "--no-webui"]
    if model.mode == "embeddings":
        argv.append("--embeddings")
    elif model.mode == "reranking":
        argv.append("--reranking")
    else:
        try:
            info = gguf_info(main)
        except (OSError, GGUFError):
            info = None
        if info is None or info.has_chat_template:
            argv.append("--jinja")
        else:
            # A built-in template by name. Jinja is on by default and would read the name as the template
            # itself, so it is switched off first (order matters to llama-server's parser).
            argv += ["--no-jinja", "--chat-template", TEMPLATE_BY_ARCH.get(info.architecture, "chatml")]
    if files.get("mmproj"):
        argv += ["--mmproj", str(files["mmproj"][0])]
    user_args = split_args(options.get("llamacpp_args", ""), FORBIDDEN_LLAMACPP_FLAGS)
    if "mtp" in model.labels and "--spec-type" not in user_args:
        argv += MTP_ARGS  # user_args come last, so the user's own values still win
    return argv + user_args


def describe_command(argv: list[str]) -> str:
    return shlex.join(argv)
