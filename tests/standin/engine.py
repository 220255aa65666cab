"""The engine description of the stand-in llama-server (llama_server.py), for the fast test layer.

It is the real llama.cpp engine description (options, flag checks, endpoints, downsizing) with the
process swapped: `launch` starts `python -m tests.standin.llama_server` through the same
`WrappedServer` as every engine, so the router's process handling (readiness, crash reports, kills,
process groups) is the real one. Each model's behaviour is set by the test (`behave`): how long its
load takes, how much memory it holds, how many slots and how much context it has.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemonade.backends.base import WrappedServer
from lemonade.backends.engine import BackendState, Launch, Progress
from lemonade.backends.llamacpp.engine import LlamaCppEngine
from lemonade.backends.llamacpp.spec import speculation_args
from lemonade.config import Config
from lemonade.model_info import ModelInfo

ROOT = Path(__file__).resolve().parents[2]  # the repository: `tests.standin` is importable from there


@dataclass
class Behaviour:
    load_seconds: float = 0.0
    memory_mb: int = 0
    ctx_size: int = 4096
    slots: int = 4
    unified: bool = False  # one KV cache shared by the slots (-kvu): what warm swaps restore into is bounded
    exit_seconds: float = 0.0  # how long it goes on after SIGTERM (a real engine saving or freeing a large cache)


class StandInEngine(LlamaCppEngine):
    backends = ("cpu",)
    process = "standin-llama-server"

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.behaviours: dict[str, Behaviour] = {}
        self.launches: list[str] = []  # model names, in the order their processes were started

    def behave(self, model_name: str, **behaviour: Any) -> None:
        self.behaviours[model_name] = Behaviour(**behaviour)

    def state(self, backend: str) -> BackendState:
        return BackendState(self.recipe, backend, "installed", version="standin")

    def install(self, backend: str, progress: Progress = None, force: bool = False) -> dict[str, Any]:
        return {}

    def uninstall(self, backend: str) -> dict[str, Any]:
        return {}

    def default_backend(self) -> str:
        return "cpu"

    def ready_backend(self, requested: str) -> str:
        return requested

    def check_model(self, model: ModelInfo, backend: str) -> None:
        return None

    def check_args(self, text: str, *, trusted: bool = False, backend: str | None = None) -> list[str]:
        from lemonade.backends.llamacpp.flags import check_llamacpp_args

        return check_llamacpp_args(text, trusted=trusted)  # no binary to ask which flags it knows

    def context_length(self, options: dict[str, Any], files: dict[str, list[Path]] | None) -> int | None:
        ctx = options.get("ctx_size")
        return ctx if isinstance(ctx, int) and ctx > 0 else 4096

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        b = self.behaviours.get(model.name, Behaviour())
        ctx = options.get("ctx_size")
        ctx = ctx if isinstance(ctx, int) and ctx > 0 else b.ctx_size
        slot_dir = self.cache_dir / "slots" / re.sub(r"[^\w.-]", "_", model.name)
        slot_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.standin.llama_server", "--port", str(port), "--alias", model.public,
                "--ctx-size", str(ctx), "--parallel", str(b.slots), "--slot-save-path", str(slot_dir),
                "--load-seconds", str(b.load_seconds), "--memory-mb", str(b.memory_mb),
                "--exit-seconds", str(b.exit_seconds),
                *(["-kvu"] if b.unified else [])]
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, cwd=ROOT)
        self.launches.append(model.name)
        await server.start(self.ready_timeout)
        # The speculative decoding the real engine would start with (the stand-in only reports it).
        _, speculation = speculation_args(model, files, options, [], self.speculation_wanted(model.name))
        return Launch(server, {**options, "llamacpp_backend": backend, "resolved_ctx_size": ctx}, backend,
                      context_length=ctx, context_reason="stand-in", speculation=speculation, slots=b.slots,
                      prefix_copy=self.warm_swaps)  # no sliding window: a restored prefix is kept, as llama-server does
