"""The scheduler and housekeeping (runtime/router/) against the engine stand-in (tests/standin).

Real processes (the stand-in llama-server starts in tens of milliseconds), the real router, no
model: what is checked is who gets a slot, when processes start and stop, and what a crash or a
hang does. Each test shuts its router down, which stops every engine it started (by pid).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from lemonade.errors import APIError
from tests.unit.standin_world import model, router, run, until


async def _serve(r, m, hold: float = 0.0) -> str:
    async with r.use(m, {}) as lm:
        await asyncio.sleep(hold)
        return lm.name


def test_sixteen_concurrent_requests_for_an_unloaded_model_cause_one_load(tmp_path):
    r, engine = router(tmp_path)
    a = model("a")

    async def scenario() -> list[str]:
        try:
            return await asyncio.gather(*(_serve(r, a, 0.01) for _ in range(16)))
        finally:
            await r.shutdown()

    assert run(scenario) == ["user.a"] * 16
    assert engine.launches == ["user.a"]
    assert r.stats.loads == 1


def test_two_models_one_slot_take_turns_in_batches(tmp_path):
    # swap_batch 4 (default 32) so a few requests show the turns
    r, engine = router(tmp_path, swap_batch=4)
    a, b = model("a"), model("b")

    async def scenario() -> list[str]:
        try:
            return await asyncio.gather(*(_serve(r, m, 0.02) for m in [a, b] * 8))
        finally:
            await r.shutdown()

    served = run(scenario)
    assert sorted(served) == ["user.a"] * 8 + ["user.b"] * 8
    # Each model loads at most once per batch of 4 of its 8 requests: never a load per request.
    assert 2 <= len(engine.launches) <= 4
    assert engine.launches[0] == "user.a"


def test_the_next_model_starts_while_the_one_it_replaces_stops(tmp_path, monkeypatch):
    """A swap does not wait for the old engine's exit (a real one saves its conversations and frees
    its cache meanwhile): here it takes 3 s after SIGTERM, and the next model answers before that. The
    thread choice of the next engine is told the old one is leaving (backends/cpu_share.py)."""
    from lemonade.runtime.router import scheduler

    leaving: list[int | None] = []
    monkeypatch.setattr(scheduler.OWN_LOAD, "leaving", leaving.append)
    r, engine = router(tmp_path)
    a, b = model("a"), model("b")
    engine.behave("user.a", exit_seconds=3.0)

    async def scenario() -> tuple[int | None, bool, bool]:
        try:
            async with r.use(a, {}) as first:
                pid = first.server.pid
            await _serve(r, b)
            a_running = os.path.exists(f"/proc/{pid}") and r.resident("user.a") is None
            await until(lambda: not any(lm.name == "user.a" for lm in r.processes()), 20)
            return pid, a_running, not any(lm.name == "user.a" for lm in r.processes())
        finally:
            await r.shutdown()

    pid, a_running_while_b_answered, a_stopped = run(scenario)
    assert engine.launches == ["user.a", "user.b"]
    assert a_running_while_b_answered and a_stopped
    assert leaving == [pid]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_engine_starts_load_no_certificate_store(tmp_path, monkeypatch):
    """Each certificate store httpx loads costs about 15 ms of the event loop's CPU; an engine start's
    readiness poll made a client, and so loaded one, on every load of a swap (util/http_client.py)."""
    import ssl

    loads: list[object] = []
    default_context = ssl.create_default_context

    def counted(*args: object, **kwargs: object) -> ssl.SSLContext:
        loads.append(args or kwargs)
        return default_context(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl, "create_default_context", counted)
    r, engine = router(tmp_path)

    async def scenario() -> None:
        try:
            for name in ("a", "b", "a"):
                await _serve(r, model(name))
        finally:
            await r.shutdown()

    run(scenario)
    assert engine.launches == ["user.a", "user.b", "user.a"]
    assert len(loads) <= 1, loads  # the shared store, if this process had not loaded it yet


def test_a_crashed_engine_is_reported_and_loaded_again_by_the_next_request(tmp_path):
    r, engine = router(tmp_path)
    a = model("a")

    async def scenario() -> dict:
        try:
            async with r.use(a, {}) as lm:
                pid = lm.server.pid
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if "user.a" in r.crashed:
                    break
                await asyncio.sleep(0.02)
            report = dict(r.crashed["user.a"])
            await _serve(r, a)
            return report
        finally:
            await r.shutdown()

    report = run(scenario)
    assert report["exit_code"] == -signal.SIGKILL and "started again" in report["message"]
    assert engine.launches == ["user.a", "user.a"]


def test_the_watchdog_kills_a_busy_engine_that_makes_no_progress(tmp_path):
    # engine_watchdog_seconds 2 (default 120): the test waits for the kill
    r, engine = router(tmp_path, engine_watchdog_seconds=2)
    a = model("a")

    async def scenario() -> tuple[int, bool]:
        try:
            lm = await r.acquire(a, {})
            os.kill(lm.server.pid, signal.SIGSTOP)  # busy (acquired) and silent
            deadline = time.monotonic() + 15
            while lm.server.alive and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            r.release(lm)
            return r.stats.watchdog_kills, lm.server.alive
        finally:
            await r.shutdown()

    kills, alive = run(scenario)
    assert kills == 1 and not alive


def test_idle_models_with_auto_evict_are_unloaded_and_pinned_ones_kept(tmp_path):
    # auto_evict with a 1 s idle timeout (defaults: off, 300 s), two types so both stay loaded
    r, engine = router(tmp_path, auto_evict=True, max_loaded_models=2)
    a, b = model("a"), model("b")
    options = {"evict_idle_timeout": 1, "downsize_idle_timeout": 0.5}

    async def scenario() -> tuple[bool, bool, int]:
        try:
            await r.ensure_loaded(a, options)
            await r.ensure_loaded(b, options, pinned=True)
            for _ in range(60):
                if r.resident("user.a") is None:
                    break
                await asyncio.sleep(0.1)
            return r.resident("user.a") is None, r.resident("user.b") is not None, r.stats.idle_evictions
        finally:
            await r.shutdown()

    a_gone, b_kept, evictions = run(scenario)
    assert a_gone and b_kept and evictions == 1


def test_ensure_loaded_starts_the_engine_again_only_when_its_options_change(tmp_path):
    r, engine = router(tmp_path)
    a = model("a")

    async def scenario() -> list[int]:
        try:
            # resolved options name every option: the backend as the user left it (auto)
            pids = [(await r.ensure_loaded(a, {"ctx_size": 1024, "llamacpp_backend": "auto"})).server.pid]
            pids.append((await r.ensure_loaded(a, {"ctx_size": 1024, "llamacpp_backend": "auto"})).server.pid)
            pids.append((await r.ensure_loaded(a, {"ctx_size": 2048, "llamacpp_backend": "auto"})).server.pid)
            return pids
        finally:
            await r.shutdown()

    first, same, changed = run(scenario)
    assert first == same != changed
    assert engine.launches == ["user.a", "user.a"]


def test_a_request_that_leaves_the_queue_causes_no_load(tmp_path):
    r, engine = router(tmp_path)
    a, b = model("a"), model("b")

    async def scenario() -> None:
        try:
            lm = await r.acquire(a, {})  # a holds the only slot
            waiting = asyncio.ensure_future(r.acquire(b, {}))
            await asyncio.sleep(0.2)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            r.release(lm)
            await asyncio.sleep(0.3)
        finally:
            await r.shutdown()

    run(scenario)
    assert engine.launches == ["user.a"]


def test_a_full_queue_answers_503_with_retry_after(tmp_path):
    # max_queue_depth 2 (default 256) so three waiters fill it
    r, engine = router(tmp_path, max_queue_depth=2)
    a, b = model("a"), model("b")

    async def scenario() -> tuple[APIError, list[str]]:
        try:
            lm = await r.acquire(a, {})  # busy: b's requests wait for a to finish
            waiters = [asyncio.ensure_future(_serve(r, b)) for _ in range(2)]
            await asyncio.sleep(0.1)
            with pytest.raises(APIError) as refused:
                await r.acquire(b, {})
            r.release(lm)
            return refused.value, await asyncio.gather(*waiters)
        finally:
            await r.shutdown()

    err, served = run(scenario)
    assert err.status == 503 and err.headers == {"Retry-After": "5"}
    assert served == ["user.b", "user.b"] and engine.launches == ["user.a", "user.b"]


def test_every_slot_pinned_refuses_the_waiting_model_with_409(tmp_path):
    r, engine = router(tmp_path)
    a, b = model("a"), model("b")

    async def scenario() -> APIError:
        try:
            await r.ensure_loaded(a, {}, pinned=True)
            with pytest.raises(APIError) as refused:
                await r.acquire(b, {})
            return refused.value
        finally:
            await r.shutdown()

    err = run(scenario)
    assert err.status == 409 and err.code == "slots_pinned_error"
    assert engine.launches == ["user.a"]


def test_an_engine_loaded_a_moment_ago_counts_once_against_a_memory_cgroup(tmp_path, monkeypatch):
    """In a memory cgroup the budget is its limit less what is not ours: the cgroup's anonymous memory
    less what our engines were measured to hold. An engine that finished loading before housekeeping's
    next measurement must still count once (its estimate), not also as someone else's memory: here the
    second model fits beside the first, and nothing is evicted for it."""
    from lemonade.backends.engine import MemoryNeed
    from lemonade.system.memory import CgroupMemory, MemoryBudget, process_tree_memory

    r, engine = router(tmp_path)
    chat, embed = model("a"), model("e", mode="embeddings")  # two types: each has a slot of its own
    engine.behave(chat.name, memory_mb=64)  # touched, so it is resident anonymous memory
    mib, estimate, server = 1 << 20, 100 << 20, 50 << 20
    limit = server + (32 << 20) + 2 * estimate + (40 << 20)  # the reserve (32 MiB), both models, 40 MiB to spare
    monkeypatch.setattr(engine, "memory_need", lambda *args: MemoryNeed(estimate))

    def in_the_cgroup(engines_bytes: int = 0, engines_anon_bytes: int = 0) -> MemoryBudget:
        """What the kernel would say: the server's own memory and every live engine's, now."""
        live = [process_tree_memory(lm.server.pid) for lm in r.processes() if lm.server.pid is not None]
        anon = server + sum(size[1] for size in live if size is not None)
        group = CgroupMemory(2, tmp_path, limit, anon, 0, anon, 0)
        return MemoryBudget(64 << 30, 60 << 30, group, engines_bytes, engines_anon_bytes)

    monkeypatch.setattr("lemonade.runtime.router.scheduler.read_budget", in_the_cgroup)

    async def scenario() -> tuple[int, bool]:
        try:
            async with r.use(chat, {}) as first:
                pid = first.server.pid
            held = process_tree_memory(pid)
            assert held is not None and held[1] > 64 * mib  # the engine really holds what it would double count
            await _serve(r, embed)  # at once: before housekeeping's first measurement, a second after the load
            return r.stats.memory_evictions, r.resident(chat.name) is not None
        finally:
            await r.shutdown()

    assert run(scenario) == (0, True)
