"""A router with the stand-in engine (tests/standin), built in-process for the fast layer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from lemonade.config import Config
from lemonade.model_info import ModelInfo
from lemonade.runtime.engine_client import EngineClient
from lemonade.runtime.router import Router
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


def run(scenario: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
    """Run a scenario to its end; every engine it started is stopped by its router's shutdown."""
    return asyncio.run(asyncio.wait_for(scenario(), timeout))  # type: ignore[arg-type]
