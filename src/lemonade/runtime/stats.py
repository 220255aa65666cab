"""`/v1/stats`: figures from the engine's own timings for the last request, plus running totals.

Speculative decoding adds the last request's draft tokens, how many the model accepted and its
measured speed-up, the running totals of both, and (`api/lemonade/status.py`) each model's figures
from the controller (runtime/speculation.py)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

ROUTE_CONVERSATIONS_KEPT = 1024  # conversations whose last routed member is remembered (least recent dropped)
_TOTALS = ("request_count_total", "input_tokens_total", "output_tokens_total", "prompt_tokens_total",
           "cache_tokens_total", "routing_decisions_total", "routing_switches_total", "draft_tokens_total",
           "draft_accepted_tokens_total")
# The last request's speculative decoding (llama-server's `timings.draft_n` / `draft_n_accepted`, absent
# when it drafted nothing) and its measured speed-up (runtime/speculation.py); None when not known.
_SPECULATION = ("draft_tokens", "draft_accepted_tokens", "draft_acceptance_rate", "speculative_speedup")


def cache_tokens_of(body: Any) -> int | None:
    """Prompt tokens the engine served from its cache, by llama-server's `timings.cache_n` or an
    OpenAI `usage.prompt_tokens_details.cached_tokens`; None when the answer does not say."""
    if not isinstance(body, dict):
        return None
    timings, usage = body.get("timings"), body.get("usage")
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        return timings["cache_n"]
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


class Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict[str, Any] = {"time_to_first_token": None, "tokens_per_second": None, "input_tokens": None,
                                     "output_tokens": None, "prompt_tokens": None, "cache_tokens": None,
                                     **dict.fromkeys(_SPECULATION)}
        self.totals = dict.fromkeys(_TOTALS, 0)
        self._routes: OrderedDict[str, str] = OrderedDict()  # conversation key -> member it was last routed to

    def record(self, *, ttft: float | None, tps: float | None, input_tokens: int | None,
               output_tokens: int | None, cache_tokens: int | None, prompt_tokens: int | None = None,
               drafted: int | None = None, accepted: int | None = None, speedup: float | None = None) -> None:
        """`prompt_tokens`: the whole prompt where the answer counts it so (OpenAI's `prompt_tokens`
        includes the cached ones); else llama.cpp's way, the tokens evaluated plus those from its cache.
        `drafted`/`accepted`: speculative decoding's draft tokens; `speedup`: its measured speed-up."""
        prompt = prompt_tokens if prompt_tokens is not None else \
            (input_tokens or 0) + (cache_tokens or 0) if input_tokens is not None else None
        rate = round(accepted / drafted, 4) if drafted and accepted is not None else None
        with self._lock:
            self.last = {"time_to_first_token": ttft, "tokens_per_second": tps, "input_tokens": input_tokens,
                         "output_tokens": output_tokens, "prompt_tokens": prompt, "cache_tokens": cache_tokens,
                         "draft_tokens": drafted, "draft_accepted_tokens": accepted, "draft_acceptance_rate": rate,
                         "speculative_speedup": speedup}
            self.totals["request_count_total"] += 1
            self.totals["input_tokens_total"] += input_tokens or 0
            self.totals["output_tokens_total"] += output_tokens or 0
            self.totals["prompt_tokens_total"] += prompt or 0
            self.totals["cache_tokens_total"] += cache_tokens or 0
            self.totals["draft_tokens_total"] += drafted or 0
            self.totals["draft_accepted_tokens_total"] += accepted or 0

    def record_llamacpp(self, body: dict[str, Any], speedup: float | None = None) -> tuple[int | None, int | None]:
        """Take llama-server's `timings` (or OpenAI `usage`) from a response; returns (in, out) tokens.
        `speedup`: what speculative decoding measurably gave this response (runtime/speculation.py)."""
        timings = body.get("timings") if isinstance(body, dict) else None
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(timings, dict):
            prompt_n = timings.get("prompt_n")
            predicted = timings.get("predicted_n")
            prompt_ms = timings.get("prompt_ms")
            self.record(ttft=round(prompt_ms / 1000, 4) if isinstance(prompt_ms, (int, float)) else None,
                        tps=timings.get("predicted_per_second"), input_tokens=prompt_n,
                        output_tokens=predicted, cache_tokens=timings.get("cache_n"),
                        drafted=timings.get("draft_n"), accepted=timings.get("draft_n_accepted"), speedup=speedup)
            return prompt_n, predicted
        if isinstance(usage, dict):  # a cloud provider's answer: its cached prompt tokens count too
            prompt_n = usage.get("prompt_tokens", usage.get("input_tokens"))
            out = usage.get("completion_tokens", usage.get("output_tokens"))
            whole = prompt_n if isinstance(prompt_n, int) else None
            self.record(ttft=None, tps=None, input_tokens=prompt_n, output_tokens=out,
                        cache_tokens=cache_tokens_of(body), prompt_tokens=whole)
            return prompt_n, out
        return None, None

    def record_route(self, conversation: str, member: str) -> bool:
        """Count a `collection.router` decision; True when it sent this conversation somewhere else
        than its previous turn (`routing_switches_total`, a measure of route ping-pong)."""
        with self._lock:
            self.totals["routing_decisions_total"] += 1
            previous = self._routes.pop(conversation, None)
            self._routes[conversation] = member
            if len(self._routes) > ROUTE_CONVERSATIONS_KEPT:
                self._routes.popitem(last=False)
            switched = previous is not None and previous != member
            if switched:
                self.totals["routing_switches_total"] += 1
            return switched

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.last, **self.totals}
