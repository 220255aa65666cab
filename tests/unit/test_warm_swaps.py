"""Warm swaps (issue 40) on the engine stand-in: what the router saves at unload, restores at load,
and how it routes a conversation back to its slot. The stand-in keeps each slot's prompt (its words)
and reports `cache_n` as llama-server does, so the tests read what a client would.

End to end on the real engine and Gemma 3: tests/test_warm_swaps.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from lemonade.runtime.proxy import timings_at_end
from lemonade.runtime.slot_affinity import SlotAffinity
from tests.unit.standin_world import app_client, run, until

A, B = "model-a", "model-b"


def words(n: int, seed: int = 0) -> str:
    return " ".join(f"w{(i * 7 + seed) % 1000}" for i in range(n))


async def chat(http: httpx.AsyncClient, model: str, messages: list[dict]) -> dict:
    resp = await http.post("/api/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    return resp.json()


def states(tmp: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp / "cache" / "slots").glob("*/warm-*.json"))]


async def stopped(services: Any) -> None:
    """Until the models a swap evicted have saved their conversations and exited: the next model
    answers meanwhile (its load does not wait for the exit)."""
    await until(lambda: len(services.router.processes()) <= len(services.router.loaded), 20)


async def in_engine(services: Any) -> SlotAffinity:
    """Once a request is in the engine of the (one) loaded model: its slots. Awaited rather than slept
    for, so a slow start on a busy machine cannot reorder what a test sends next."""
    await until(lambda: bool(services.router.loaded))
    affinity = next(iter(services.router.loaded.values())).affinity
    assert affinity is not None
    await until(lambda: bool(affinity.serving))
    return affinity


def test_a_conversation_survives_a_swap_and_goes_back_to_its_slot(tmp_path):
    # one model at a time (default 1 llm slot): B's request evicts A, A's next turn loads it again
    async def scenario() -> tuple[int, int, list[dict], list[str]]:
        async with app_client(tmp_path, models=(A, B)) as (http, services, engine):
            system = {"role": "system", "content": words(300)}
            first = [system, {"role": "user", "content": "hello"}]
            await chat(http, A, first)
            other = [system, {"role": "user", "content": "something else entirely " + words(50, 3)}]
            await chat(http, A, other)  # a second conversation, on another slot
            await chat(http, B, [{"role": "user", "content": "hi"}])  # the swap
            await stopped(services)
            saved = states(tmp_path)
            again = await chat(http, A, first + [{"role": "assistant", "content": "tok0 tok1"},
                                                 {"role": "user", "content": "more"}])
            other_again = await chat(http, A, other + [{"role": "user", "content": "and"}])
            return again["timings"]["cache_n"], other_again["timings"]["cache_n"], saved, engine.launches

    cached, other_cached, saved, launches = run(scenario)
    assert launches == ["extra.model-a", "extra.model-b", "extra.model-a"]
    assert {s["model"] for s in saved} == {"extra.model-a"} and len(saved) == 2
    assert all(s["tokens"] > 300 for s in saved)
    # every word of each conversation's earlier turn came back from the restored slot
    assert cached == 301 and other_cached == 353  # system prompt and first message; the other one's too


def test_a_new_conversation_starts_from_the_prefix_another_slot_holds(tmp_path):
    """A second conversation with the same system prompt goes to an empty slot (the first keeps its
    cache) and gets the first one's state copied in: only what follows the system prompt is read."""
    async def scenario() -> tuple[dict, dict, dict, list[str]]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            system = {"role": "system", "content": words(800)}  # above slot_affinity.WORTH_COPYING characters
            one = await chat(http, A, [system, {"role": "user", "content": "first conversation"}])
            two = await chat(http, A, [system, {"role": "user", "content": "second conversation"}])
            short = await chat(http, A, [{"role": "user", "content": "a third, sharing nothing"}])
            leftovers = [p.name for p in (tmp_path / "cache" / "slots").glob("**/*") if p.is_file()]
            return one["timings"], two["timings"], short["timings"], leftovers

    one, two, short, leftovers = run(scenario)
    assert one["cache_n"] == 0 and one["prompt_n"] > 800
    assert two["cache_n"] >= 800 and two["prompt_n"] < 10  # the system prompt came from the first slot
    assert short["cache_n"] == 0  # nothing worth copying: nothing copied
    assert leftovers == []  # the copy's file is gone


def test_a_state_is_never_restored_into_another_layout(tmp_path):
    async def scenario() -> tuple[int, int]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            convo = [{"role": "user", "content": words(200)}]
            assert (await http.post("/api/v1/load", json={"model_name": A, "ctx_size": 2048})).status_code == 200
            await chat(http, A, convo)
            # a load with another context: the state saved at this unload does not fit it
            assert (await http.post("/api/v1/load", json={"model_name": A, "ctx_size": 4096})).status_code == 200
            other_layout = (await chat(http, A, convo + [{"role": "user", "content": "x"}]))["timings"]["cache_n"]
            assert (await http.post("/api/v1/load", json={"model_name": A, "ctx_size": 2048})).status_code == 200
            same_layout = (await chat(http, A, convo + [{"role": "user", "content": "y"}]))["timings"]["cache_n"]
            return other_layout, same_layout

    other_layout, same_layout = run(scenario)
    assert other_layout == 0 and same_layout >= 200


def test_the_store_keeps_to_its_cap_and_leaves_no_half_file(tmp_path):
    # a store of 10 kB (default 4 GB): each stand-in state is a few kB, so older ones must go
    async def scenario() -> tuple[list[dict], dict]:
        async with app_client(tmp_path, models=(A, B), kv_store_gb=10e-6) as (http, services, engine):
            for i in range(4):
                await chat(http, A, [{"role": "user", "content": words(300, i)}])
                await chat(http, B, [{"role": "user", "content": words(300, 100 + i)}])
            await stopped(services)
            health = (await http.get("/api/v1/health")).json()
            return states(tmp_path), health["kv_store"]

    left, store = run(scenario)
    total = sum(p.stat().st_size for p in (tmp_path / "cache" / "slots").glob("*/warm-*.bin"))  # after shutdown's save
    assert left and 0 < store["bytes"] <= 10_000 and store["cap_bytes"] == 10_000 and total <= 10_000
    assert not list((tmp_path / "cache" / "slots").glob("**/*.partial"))


def test_warm_swaps_off_saves_nothing_and_a_crash_leftover_is_removed_at_start(tmp_path):
    leftover = tmp_path / "cache" / "slots" / "extra.model-a" / "warm-0123-s0.partial"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"cut short")

    # kv_store_gb 0 turns warm swaps off (default 4)
    async def scenario() -> list[dict]:
        async with app_client(tmp_path, models=(A, B), kv_store_gb=0) as (http, services, engine):
            await chat(http, A, [{"role": "user", "content": words(100)}])
            await chat(http, B, [{"role": "user", "content": words(100, 5)}])
            return states(tmp_path)

    assert run(scenario) == []
    assert not leftover.exists()


def test_a_unified_cache_takes_back_the_newest_conversations_and_leaves_a_slot_free(tmp_path):
    """Four conversations of about 300 tokens fill four slots sharing a 1,024-cell cache; after a swap, the
    two used last come back (600 tokens, within the 768 that leave one slot's share free) and the two
    older ones stay saved: restoring all four would leave a new request no room, and llama-server would
    clear slots to make it."""
    async def scenario() -> tuple[list[int], list[dict], int]:
        async with app_client(tmp_path, models=(A, B)) as (http, services, engine):
            engine.behave(f"extra.{A}", ctx_size=1024, slots=4, unified=True)
            talks = [[{"role": "user", "content": words(300, seed) + f" conversation {seed}"}] for seed in range(4)]
            for talk in talks:  # one after another: conversation 3 is the one used last
                await chat(http, A, talk)
            await chat(http, B, [{"role": "user", "content": "hi"}])  # the swap: A's four slots saved
            await stopped(services)
            saved = states(tmp_path)
            cached = []
            for talk in reversed(talks):  # newest first, so an older one's prompt overwrites no restored slot
                answer = await chat(http, A, talk + [{"role": "assistant", "content": "tok0 tok1"},
                                                     {"role": "user", "content": "more"}])
                cached.append(answer["timings"]["cache_n"])
            return cached, saved, len([s for s in states(tmp_path) if s["model"] == f"extra.{A}"])

    cached, saved, kept = run(scenario)
    assert len(saved) == 4 and all(290 < s["tokens"] < 320 and s["model"] == f"extra.{A}" for s in saved)
    assert cached[0] > 290 and cached[1] > 290  # conversations 3 and 2 came back from their slots
    assert cached[2] < 50 and cached[3] < 50  # 1 and 0 were read again: no room was taken for them
    assert kept == 4  # the two not restored are still saved for a later load


def test_no_request_is_sent_to_a_slot_while_it_serves_another(tmp_path):
    """Turns of one conversation sent at once, among other conversations, more of them than slots:
    a request waits in the router for its slot, so the engine never gets one naming a busy slot (with
    llama-server b11312 the running request's context was replaced, and the capped workload of
    tests/test_memory.py hung; runtime/slot_affinity.py)."""
    async def scenario() -> tuple[list[int], int, int]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            convo = [{"role": "system", "content": words(800)}, {"role": "user", "content": "hello"}]
            await chat(http, A, convo)

            async def turn(messages: list[dict]) -> int:
                resp = await http.post("/api/v1/chat/completions", json={"model": A, "messages": messages,
                                                                         "max_tokens": 10})
                return resp.status_code

            slow = "STANDIN:slow=0.03"  # each answer takes 0.3 s, so the requests overlap
            again = [convo + [{"role": "assistant", "content": "tok0 tok1"}, {"role": "user", "content": f"{slow} {i}"}]
                     for i in range(3)]
            others = [[{"role": "user", "content": f"{slow} {words(40, 10 + i)}"}] for i in range(12)]

            async def named(i: int) -> int:  # a client's own `id_slot` waits for that slot too
                resp = await http.post("/api/v1/chat/completions", json={
                    "model": A, "id_slot": 1, "max_tokens": 10,
                    "messages": [{"role": "user", "content": f"{slow} {words(30, 50 + i)}"}]})
                return resp.status_code

            codes = await asyncio.gather(*(turn(m) for m in again + others), *(named(i) for i in range(3)))
            lm = next(iter(services.router.loaded.values()))
            metrics = (await httpx.AsyncClient().get(lm.base_url + "/metrics")).text
            pins = int(metrics.split("standin:busy_slot_pins ")[1].split()[0])
            return list(codes), pins, lm.launch.slots

    codes, pins, slots = run(scenario)
    assert codes == [200] * 18
    assert slots >= 2 and pins == 0


def test_requests_waiting_for_a_slot_are_served_first_come_first_served():
    """Every slot busy, three requests wait; a slot frees and a fourth arrives at that moment: the first
    waiting takes it, and the newcomer queues behind the other two (runtime/slot_affinity.py)."""
    async def scenario() -> list[str]:
        aff = SlotAffinity(slots=2)
        for text in ("busy one\n", "busy two\n"):
            assert await aff.acquire(text) is not None
        order: list[str] = []

        async def request(name: str) -> None:
            slot = await aff.acquire(f"{name} {words(20)}\n")
            assert slot is not None
            order.append(name)
            await asyncio.sleep(0.01)
            aff.release(slot, name)

        waiting = [asyncio.create_task(request(n)) for n in ("a", "b", "c")]
        await asyncio.sleep(0.01)  # all three wait now
        late = asyncio.create_task(request("d"))  # starts right after the release, before "a" resumes
        aff.release(0, "busy one\n")
        await asyncio.sleep(0.01)
        aff.release(1, "busy two\n")
        await asyncio.gather(*waiting, late)
        return order

    assert run(scenario) == ["a", "b", "c", "d"]


def test_a_freed_slot_wakes_one_waiting_request_not_all():
    """Ten requests wait for a slot; one frees: one request compares its text with the slots again,
    not ten (runtime/slot_affinity.py, `_pass_on`)."""
    async def scenario() -> tuple[int, int]:
        aff = SlotAffinity(slots=2)
        for text in ("busy one\n", "busy two\n"):
            await aff.acquire(text)
        chosen = 0
        choose = aff.choose

        def counted(text: str) -> int | None:
            nonlocal chosen
            chosen += 1
            return choose(text)

        aff.choose = counted  # type: ignore[method-assign]
        waiting = [asyncio.create_task(aff.acquire(f"request {i} {words(20)}\n")) for i in range(10)]
        await asyncio.sleep(0.01)
        chosen = 0
        aff.release(0, "busy one\n")
        await asyncio.sleep(0.01)
        served = sum(t.done() for t in waiting)
        for t in waiting:
            t.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return served, chosen

    assert run(scenario) == (1, 1)


def test_a_request_cancelled_once_woken_hands_its_turn_on():
    """A waiting request woken for a freed slot and cancelled before it took it (its client left) does not
    keep the slot from the next one waiting."""
    async def scenario() -> int | None:
        aff = SlotAffinity(slots=2)
        for text in ("busy one\n", "busy two\n"):
            await aff.acquire(text)
        first = asyncio.create_task(aff.acquire(f"first {words(20)}\n"))
        second = asyncio.create_task(aff.acquire(f"second {words(20)}\n"))
        await asyncio.sleep(0.01)
        aff.release(0, "busy one\n")
        first.cancel()  # woken, not yet resumed
        await asyncio.gather(first, return_exceptions=True)
        return await asyncio.wait_for(second, 1)

    assert run(scenario) == 0


def test_conversations_arriving_together_read_their_shared_system_prompt_once(tmp_path):
    """Six conversations with the same system prompt arrive in the same instant: the first one the server
    takes reads it, and the others hold until that slot is idle and start from a copy of it, instead of
    reading the system prompt too (runtime/slot_affinity.py, `lend_donor`)."""
    async def scenario() -> list[dict]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            system = {"role": "system", "content": words(3000)}  # its reading is worth a hold longer than the answer
            answers = await asyncio.gather(*(  # sent in the same instant: whichever the server takes first leads
                chat(http, A, [system, {"role": "user", "content": f"STANDIN:slow=0.03 conversation {i}"}])
                for i in range(6)))
            return [a["timings"] for a in answers]

    timings = run(scenario)
    read_in_full = [t for t in timings if t["cache_n"] == 0 and t["prompt_n"] > 3000]
    copied = [t for t in timings if t["cache_n"] >= 3000 and t["prompt_n"] < 10]
    assert (len(read_in_full), len(copied)) == (1, 5), timings


def test_a_hold_for_a_shared_beginning_ends_when_reading_it_would_have_been_quicker(tmp_path):
    """The first conversation writes a long answer: one arriving meanwhile with the same system prompt
    stops holding once reading that prompt itself costs less (at the engine's reading speed, which an
    earlier answer measured), reads it, and is answered before the first one."""
    async def scenario() -> tuple[dict, list[str]]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            system = {"role": "system", "content": words(1000)}
            await chat(http, A, [{"role": "user", "content": words(400, 3)}])  # the stand-in reads in no time
            done: list[str] = []

            async def ask(name: str, user: str, max_tokens: int) -> dict:
                resp = await http.post("/api/v1/chat/completions", json={
                    "model": A, "max_tokens": max_tokens, "messages": [system, {"role": "user", "content": user}]})
                assert resp.status_code == 200, resp.text
                done.append(name)
                return resp.json()["timings"]

            first = asyncio.create_task(ask("first", "STANDIN:slow=0.1 write at length", 20))
            await in_engine(services)
            second = await ask("second", "a short one", 2)
            await first
            return second, done

    second, done = run(scenario)
    assert second["cache_n"] == 0 and second["prompt_n"] > 1000  # it read the system prompt itself
    assert done == ["second", "first"]


def test_the_engines_timings_are_read_from_the_end_of_its_answer():
    """How fast the engine reads (the bound of a hold) comes from llama-server's `timings`, at the end of
    a non-streamed answer, read without parsing the answer again."""
    answer = json.dumps({"choices": [{"message": {"content": "x" * 5000}}], "usage": {"prompt_tokens": 900},
                         "timings": {"cache_n": 0, "prompt_n": 900, "prompt_ms": 1700.5}}).encode()
    assert timings_at_end(answer) == {"cache_n": 0, "prompt_n": 900, "prompt_ms": 1700.5}
    assert timings_at_end(b'{"choices": [], "usage": {}}') is None
    assert timings_at_end(b'{"timings": {"cache_n": 0, "prom') is None  # cut short: nothing, no error


def test_a_hold_lasts_while_a_streamed_request_reads_its_prompt_however_long(tmp_path):
    """The first conversation, streamed, takes longer to read its prompt than the bound of a hold (the
    stand-in sends its first token after 3 s): the others hold until it answers and copy its slot, since
    reading the system prompt themselves would not have been quicker on the same cores."""
    async def scenario() -> list[dict]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            system = {"role": "system", "content": words(450)}  # a bound of about 2 s at the unmeasured speed

            async def streamed() -> None:
                body = {"model": A, "max_tokens": 1, "stream": True,
                        "messages": [system, {"role": "user", "content": "STANDIN:slow=3 the first"}]}
                async with http.stream("POST", "/api/v1/chat/completions", json=body) as resp:
                    assert resp.status_code == 200
                    async for _ in resp.aiter_bytes():
                        pass

            first = asyncio.create_task(streamed())
            await in_engine(services)
            others = await asyncio.gather(*(chat(http, A, [system, {"role": "user", "content": f"conversation {i}"}])
                                            for i in range(2)))
            await first
            return [o["timings"] for o in others]

    timings = run(scenario)
    assert all(t["cache_n"] >= 450 and t["prompt_n"] < 10 for t in timings), timings


def test_a_request_that_leaves_while_it_holds_leaves_its_slot_as_it_was(tmp_path):
    """A client gone while its request holds for another slot's read: the request never reached the
    engine, so the router does not take its slot to hold that request's conversation."""
    async def scenario() -> tuple[str, list[str]]:
        async with app_client(tmp_path, models=(A,)) as (http, services, engine):
            system = {"role": "system", "content": words(3000)}
            # the first answers for 2 s; the states below are awaited, not timed, so a slow start cannot
            # let the first finish before the second holds for it
            first = asyncio.create_task(chat(http, A, [system, {"role": "user", "content": "STANDIN:slow=1 first"}]))
            affinity = await in_engine(services)
            leaving = asyncio.create_task(chat(http, A, [system, {"role": "user", "content": "gone before its turn"}]))
            await until(lambda: any(affinity._readers.values()))  # it holds for the first one's slot now
            assert not first.done()
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
            await first
            return affinity.held.get(0, ""), list(affinity.held.values())

    first_slot, held = run(scenario)
    assert "first" in first_slot
    assert not any("gone before its turn" in text for text in held)
