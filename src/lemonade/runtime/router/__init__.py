"""Residency for every engine: which models are loaded, who waits for which, what leaves.

Three rooms: `rules` (pure decisions), `scheduler` (the `Router`: waiters, dispatch, loads,
unloads, crashes, and the queries other packages ask) and `housekeeping` (idle models, memory
pressure, the watchdog); `state` holds the records they share and `prepare` the installs and
downloads a load waits for.
"""

from lemonade.runtime.router.scheduler import Router
from lemonade.runtime.router.state import HELPER, STANDARD, LoadedModel, ModelState, QueueStats, Waiter

__all__ = ["HELPER", "STANDARD", "LoadedModel", "ModelState", "QueueStats", "Router", "Waiter"]
