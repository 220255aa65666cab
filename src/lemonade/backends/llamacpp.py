"""llama.cpp: turning a model and its resolved options into a `llama-server` command line."""

from __future__ import annotations

import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from lemonade.catalog.gguf_meta import GGUFError, gguf_info
from lemonade.catalog.models import ModelInfo
from lemonade.runtime.options import FORBIDDEN_LLAMACPP_FLAGS, split_args

AUTO_CTX_CAP = 8192       # automatic context: the model's trained length, capped to keep RAM modest
FALLBACK_CTX = 4096       # when the GGUF does not say
# Jinja templates we ship for GGUFs that carry none (base models), by architecture prefix.
TEMPLATES = resources.files("lemonade.backends").joinpath("templates")
MTP_ARGS = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.75"]


def fallback_template(architecture: str) -> Path:
    """A Jinja chat template file (Jinja keeps tool calling working, unlike llama.cpp's named ones)."""
    name = "gemma.jinja" if architecture.startswith("gemma") else "chatml.jinja"
    return Path(str(TEMPLATES.joinpath(name)))


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
        argv.append("--jinja")
        try:
            info = gguf_info(main)
        except (OSError, GGUFError):
            info = None
        if info is not None and not info.has_chat_template:
            argv += ["--chat-template-file", str(fallback_template(info.architecture))]
    if files.get("mmproj"):
        argv += ["--mmproj", str(files["mmproj"][0])]
    user_args = split_args(options.get("llamacpp_args", ""), FORBIDDEN_LLAMACPP_FLAGS)
    if "mtp" in model.labels and "--spec-type" not in user_args:
        argv += MTP_ARGS  # user_args come last, so the user's own values still win
    return argv + user_args


def describe_command(argv: list[str]) -> str:
    return shlex.join(argv)
