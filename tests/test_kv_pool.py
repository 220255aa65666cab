"""Admission to a shared KV cache (runtime/kv_pool.py), as pure asyncio: what a request reserves,
when the engine's tokenizer is asked, who waits and in which order, and that nothing leaks when a
waiting client leaves. The end-to-end proof with the real engine is tests/test_context.py."""

from __future__ import annotations

import asyncio

import pytest

from lemonade.runtime.kv_pool import DEFAULT_ANSWER_TOKENS, TEMPLATE_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE, KvPool


def chat(text: str, **extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], **extra}


def counter(tokens_per_byte: float = 0.25) -> tuple[list[str], object]:
    """A stand-in for the engine's /tokenize that records what it was asked (a quarter token a byte,
    like English text)."""
    asked: list[str] = []

    async def count(text: str) -> int:
        asked.append(text)
        return int(len(text.encode()) * tokens_per_byte)

    return asked, count


OVERHEAD = TEMPLATE_TOKENS + TEMPLATE_TOKENS_PER_MESSAGE


def test_a_short_request_reserves_its_upper_bound_without_asking_the_tokenizer() -> None:
    async def main() -> None:
        pool = KvPool(32768, slots=8)
        asked, count = counter()
        held = await pool.reserve(chat("hello there", max_tokens=32), count)
        assert held == len("hello there") + OVERHEAD + 32 and pool.reserved == held and asked == []
        unlimited = await pool.reserve(chat("hi"), count)
        assert unlimited == 2 + OVERHEAD + DEFAULT_ANSWER_TOKENS  # an answer without a limit: a default share
        pool.release(held)
        pool.release(unlimited)
        assert pool.reserved == 0

    asyncio.run(main())


def test_a_bound_that_does_not_fit_is_counted_exactly() -> None:
    async def main() -> None:
        pool = KvPool(4096, slots=8)
        asked, count = counter()
        text = "word " * 2000  # 10000 bytes: the bound does not fit, 2500 tokens do
        held = await pool.reserve(chat(text, max_tokens=8), count)
        assert asked == [text] and held == 2500 + OVERHEAD + 8

    asyncio.run(main())


def test_requests_that_do_not_fit_wait_in_order_and_are_admitted_as_room_frees() -> None:
    async def main() -> None:
        pool = KvPool(1000, slots=4)
        _, count = counter(tokens_per_byte=1.0)
        first = await pool.reserve(chat("x" * 500, max_tokens=0), count)
        admitted: list[str] = []

        async def later(name: str, size: int) -> int:
            held = await pool.reserve(chat("x" * size, max_tokens=0), count)
            admitted.append(name)
            return held

        big = asyncio.create_task(later("big", 600))
        await asyncio.sleep(0)
        small = asyncio.create_task(later("small", 10))  # fits, but must not overtake the one waiting longer
        await asyncio.sleep(0.01)
        assert admitted == [] and pool.describe()["waiting"] == 2
        pool.release(first)
        held_big, held_small = await big, await small
        assert admitted == ["big", "small"] and pool.reserved == held_big + held_small <= pool.tokens
        assert pool.describe()["waits_total"] == 2

    asyncio.run(main())


def test_a_client_that_leaves_while_waiting_holds_nothing() -> None:
    async def main() -> None:
        pool = KvPool(1000, slots=4)
        _, count = counter(tokens_per_byte=1.0)
        first = await pool.reserve(chat("x" * 800, max_tokens=0), count)
        waiting = asyncio.create_task(pool.reserve(chat("x" * 800, max_tokens=0), count))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        pool.release(first)
        assert pool.reserved == 0 and pool.describe()["waiting"] == 0

    asyncio.run(main())


def test_a_prompt_larger_than_the_cache_is_left_to_the_engine_and_a_nearly_full_one_runs_alone() -> None:
    async def main() -> None:
        pool = KvPool(1000, slots=4)
        _, count = counter(tokens_per_byte=1.0)
        assert await pool.reserve(chat("x" * 2000), count) == 0  # refused by the engine with its own message
        whole = await pool.reserve(chat("x" * 900, max_tokens=500), count)
        assert whole == 1000  # prompt + answer exceed the cache: it takes all of it and runs alone
        pool.release(whole)

    asyncio.run(main())
