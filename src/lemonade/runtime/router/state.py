"""What the router knows about each live engine process and each waiting request.

A loaded model is in exactly one `ModelState`; how many requests it is serving is a count beside
it (`active`), not a state, because a ready model serves many at once. The rules (rules.py) read
these records; only the scheduler and housekeeping change them.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lemonade.backends.engine import Engine, Launch, MemoryNeed
from lemonade.model_info import ModelInfo
from lemonade.runtime.kv_pool import KvPool
from lemonade.runtime.options import RESIDENCY_OPTIONS
from lemonade.runtime.slot_affinity import SlotAffinity

STANDARD, HELPER = "standard", "routing_helper"  # residency classes (scheduler.py's docstring)
Options = dict[str, Any] | Callable[[], dict[str, Any]]  # a callable is only evaluated when a load happens


class ModelState(enum.Enum):
    """Where a loaded model is in its life. READY and DOWNSIZED admit requests (a downsized model
    becomes READY again with its first one); DRAINING finishes what it serves and admits nothing
    new, so its slot can go to a waiting model (it returns to READY if nobody needs the slot any
    more); RETIRING is out of service and stops once idle."""

    READY = "ready"
    DOWNSIZED = "downsized"  # idle long enough that its KV cache was cleared (downsize_idle_timeout)
    DRAINING = "draining"
    RETIRING = "retiring"


@dataclass
class LoadedModel:
    model: ModelInfo
    engine: Engine
    launch: Launch
    pinned: bool = False
    last_use: float = field(default_factory=time.time)
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    state: ModelState = ModelState.READY
    active: int = 0
    streaming: int = 0
    served: int = 0  # requests admitted since it was loaded
    last_progress: float = field(default_factory=time.monotonic)  # last byte relayed from the engine
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    kv: KvPool | None = None  # the engine's shared KV cache, when its slots share one (runtime/kv_pool.py)
    residency: str = STANDARD  # STANDARD or HELPER: which slot pool the process counts in
    need: MemoryNeed | None = None  # the estimate it was admitted with (None: the engine gives none)
    ctx: int | None = None  # the context the estimate is for
    memory_bytes: int | None = None  # its process tree's memory, as last measured (PSS, else RSS)
    anon_bytes: int = 0  # the anonymous part of it
    peak_bytes: int = 0  # the most it was measured to hold
    exit_reason: str | None = None  # why its process ended, once the router knows (an OOM kill, an exit code)
    affinity: SlotAffinity | None = None  # which conversation each of its slots holds (slot_affinity.py)
    exit_explained: asyncio.Future[None] | None = None  # set once the engine said what ended it (Engine.exit_cause)

    def __post_init__(self) -> None:
        self.idle.set()
        if self.kv is None and self.launch.shared_kv:
            self.kv = KvPool(*self.launch.shared_kv)
        if self.affinity is None and self.launch.slots and self.launch.slots > 1 and self.model.mode == "chat":
            self.affinity = SlotAffinity(self.launch.slots)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def type(self) -> str:
        return self.model.type

    @property
    def server(self) -> Any:
        return self.launch.server

    @property
    def options(self) -> dict[str, Any]:
        return self.launch.options

    @property
    def backend(self) -> str:
        return self.launch.backend

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def remote(self) -> bool:
        return self.engine.remote

    @property
    def retiring(self) -> bool:
        return self.state is ModelState.RETIRING

    @property
    def draining(self) -> bool:
        return self.state is ModelState.DRAINING

    @property
    def downsized(self) -> bool:
        return self.state is ModelState.DOWNSIZED

    @property
    def context_length(self) -> int | None:
        """Tokens one request may use: the running engine's own figure where it reports one, else the
        context it was started with; None when neither is known (an engine without a context)."""
        if self.launch.context_length:
            return self.launch.context_length
        ctx = self.options.get("ctx_size")
        return ctx if isinstance(ctx, int) and ctx > 0 else None

    @property
    def usable(self) -> bool:
        return not self.retiring and self.server.alive

    @property
    def estimate_bytes(self) -> int | None:
        return self.need.at(self.ctx) if self.need is not None else None

    @property
    def held_bytes(self) -> int:
        """What it counts for against the memory budget: the most it may grow to, by the estimate, or
        what it was measured to hold when that is more (a measurement replaces an estimate that fell
        short, for this model and configuration)."""
        return max(self.estimate_bytes or 0, self.peak_bytes)

    @property
    def evict_weight(self) -> float:
        return float(self.options.get("evict_weight_factor") or 1.0)

    @property
    def slot_pool(self) -> str:
        """The pool the process counts in: `<class>/<type>`, or `unmetered` for a cloud model."""
        return "unmetered" if self.remote else f"{self.residency}/{self.model.type}"

    def in_standard_pool(self, model_type: str) -> bool:
        return self.model.type == model_type and self.residency == STANDARD and not self.remote

    def describe(self) -> dict[str, Any]:
        return {
            "model_name": self.model.public,
            "checkpoint": self.model.checkpoint,
            "last_use": self.last_use,
            "type": self.model.type,
            "device": self.launch.device,
            "pinned": self.pinned,
            "status": "in_use" if self.active > 0 else "downsized" if self.downsized else "ready",
            "residency_class": self.residency,
            "slot_pool": self.slot_pool,
            "is_busy": self.active > 0,
            "is_streaming": self.streaming > 0,
            "recipe": self.model.recipe,
            "pid": self.server.pid,
            "recipe_options": {k: v for k, v in self.options.items() if k not in RESIDENCY_OPTIONS},
            "backend_url": self.server.base_url + "/v1",
            "backend": self.backend,
            "launch_command": self.engine.launch_command(self.launch),
            "load_seconds": round(self.load_seconds, 3),
            "downsized": self.downsized,
            **({"context_length": self.context_length} if self.context_length is not None else {}),
            "memory_estimate_bytes": self.estimate_bytes,
            "memory_bytes": self.memory_bytes,
            "memory_peak_bytes": self.peak_bytes or None,
            **({"kv_cache": self.kv.describe()} if self.kv is not None else {}),
        }


@dataclass
class Waiter:
    """A request waiting in the queue for its model to be resident and admitting."""

    model: ModelInfo
    options: Options
    pinned: bool | None
    future: asyncio.Future[LoadedModel]
    helper: bool = False  # a routing policy's call: loads into the routing-helper pool
    remote: bool = False  # served by a cloud provider: takes no slot
    need: MemoryNeed | None = None  # what its load would hold (None: not estimated, no memory check)
    since: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def type(self) -> str:
        return self.model.type


@dataclass
class QueueStats:
    waits: int = 0  # requests that had to wait for a slot
    wait_seconds: float = 0.0
    loads: int = 0
    evictions: int = 0  # unloads to make room for another model
    idle_evictions: int = 0
    downsizes: int = 0
    rejected: int = 0  # 503: queue full
    abandoned: int = 0  # clients that left while waiting
    watchdog_kills: int = 0
    pressure_samples: int = 0  # device memory readings taken for pressure eviction
    pressure_evictions: int = 0  # unloads because memory use passed auto_evict_threshold_pct
    memory_evictions: int = 0  # unloads to make memory room for a load
    memory_refusals: int = 0  # loads refused with 507 insufficient_memory
    oom_kills: int = 0  # engines the kernel's out-of-memory killer ended
