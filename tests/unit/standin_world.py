"""A router with the stand-in engine (tests/standin), built in-process for the fast layer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from lemonade.api.app import create_app
from lemonade.config import Config
from lemonade.model_info import ModelInfo
from lemonade.observability.logs import LogBuffer
from lemonade.runtime.engine_client import EngineClient
from lemonade.runtime.router import Router
from lemonade.services import Services
from tests.gguf_factory import write_gguf
from tests.standin.engine import StandInEngine

T = TypeVar("T")


class OneEngine:
    """The router's view of the engines (`get(recipe)`): the stand-in serves the llamacpp recipe."""

    def __init__(self, engine: StandInEngine) -> None:
        self.engine = engine

    def get(self, recipe: str) -> StandInEngine | None:
        return self.engine if recipe == self.engine.recipe else None


def model(name: str, mode: str = "chat") -> ModelInfo:
    return ModelInfo(name=f"user.{name}", recipe="llamacpp", mode=mode, checkpoints={"main": f"test/{name}:Q4"},
                     origin="user", public=name)


def router(tmp: Path, **config: Any) -> tuple[Router, StandInEngine]:
    """A router whose config has the shipped defaults but for `config` (each test says why it sets one)."""
    settings = Config(tmp / "config", cli_overrides=config, environ={})
    engine = StandInEngine(tmp / "cache", settings)

    async def files(m: ModelInfo) -> dict[str, list[Path]]:
        return {"main": [tmp / f"{m.bare}.gguf"]}

    return Router(engines=OneEngine(engine), config=settings, files_for=files, client=EngineClient()), engine  # type: ignore[arg-type]


async def until(condition: Any, timeout: float = 60.0) -> None:
    """Wait for `condition()` (a process start takes a while on a busy machine); fail after `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def run(scenario: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """Run a scenario to its end; every engine it started is stopped by its router's shutdown."""
    return asyncio.run(asyncio.wait_for(scenario(), timeout))  # type: ignore[arg-type]


MODEL = "tiny-chat"  # a GGUF in the extra models dir: the catalog reads its header; the stand-in serves it


@contextlib.asynccontextmanager
async def app_client(tmp: Path, models: tuple[str, ...] = (MODEL,), **config: Any
                     ) -> AsyncIterator[tuple[httpx.AsyncClient, Services, StandInEngine]]:
    """The whole app in-process (lifespan included) whose llama.cpp engine is the stand-in; `models`:
    GGUFs put in the extra models dir; `config`: settings a test needs (it says why)."""
    for name in models:
        write_gguf(tmp / "models" / f"{name}.gguf", context_length=4096)
    settings = Config(tmp / "config", cli_overrides=config,
                      environ={"LEMONADE_EXTRA_MODELS_DIR": str(tmp / "models")})
    services = Services(tmp / "cache", settings, LogBuffer())
    engine = StandInEngine(tmp / "cache", settings)
    services.engines.replace(engine)
    app = create_app(services)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as http:
            yield http, services, engine
