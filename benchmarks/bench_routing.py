"""Routing benchmark: what a `collection.router` decision costs before the member is asked.

Why: every request naming a router model pays for its decision on the hot path. This times the
pure engine (routing/evaluate.py) on the deterministic policies of the table tests
(tests/routing/cases/*): reading the request (`route_context`) plus `decide`, with and without a
trace, as the median of repeated rounds, next to a `json.loads` of the same body as a yardstick
(ratios against it are steadier than absolute times on a shared machine). Model-backed conditions
cost what their model call costs and are not measured here. It never asserts; results:
docs/performance.md.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_routing.py [--rounds 15] [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from lemonade.routing.context import route_context
from lemonade.routing.evaluate import decide
from lemonade.routing.policy import parse_policy

CASES = Path(__file__).resolve().parent.parent / "tests" / "routing" / "cases"
KINDS = ("vocabulary", "metadata", "char_bounds", "trace")


async def _decide_all(policy, bodies, trace: bool, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for i in range(n):
        body = bodies[i % len(bodies)]
        await decide(policy, route_context(body), want_trace=trace)
    return (time.perf_counter() - t0) / n


def _loads_all(raw: list[bytes], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        json.loads(raw[i % len(raw)])
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=2000, help="decisions per round")
    args = parser.parse_args()
    print(f"{'policy':<14}{'rules':>6}{'decide µs':>11}{'traced µs':>11}{'json.loads µs':>15}{'ratio':>7}")
    for kind in KINDS:
        policy = parse_policy(json.loads((CASES / kind / "policy.json").read_text()))
        bodies = [json.loads(line)["request"] for line in (CASES / kind / "cases.jsonl").read_text().splitlines()]
        raw = [json.dumps(b).encode() for b in bodies]
        plain, traced, loads = [], [], []
        for _ in range(args.rounds):  # interleaved, so machine load hits all three alike
            plain.append(asyncio.run(_decide_all(policy, bodies, False, args.n)))
            traced.append(asyncio.run(_decide_all(policy, bodies, True, args.n)))
            loads.append(_loads_all(raw, args.n))
        p, t, j = (statistics.median(x) * 1e6 for x in (plain, traced, loads))
        print(f"{kind:<14}{len(policy.rules):>6}{p:>11.1f}{t:>11.1f}{j:>15.1f}{p / j:>7.1f}")


if __name__ == "__main__":
    main()
