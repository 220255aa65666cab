"""What a routing decision's candidate is said to cost: `outputs.estimated_cost` (upstream Lemonade's
router, docs/routing.md "Cost").

Reporting only: the figures never change which candidate a policy picks. They come from the model's
definition: the per-million-token prices a cloud provider's listing gave (backends/cloud/providers.py)
or that an author wrote on a model entry, plus the hand-written `cost_tier` and `latency_ms_hint`.
A value that is not what the field takes (a negative price, an unknown tier) is left out rather than
shown, so a hand-edited `user_models.json` cannot make a decision fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COST_TIERS = ("free", "low", "medium", "high")
PRICE_FIELDS = ("cost_input_per_million", "cost_output_per_million")  # USD per 1M tokens
COST_FIELDS = ("cost_tier", *PRICE_FIELDS, "latency_ms_hint")
OUTPUT_KEY = "estimated_cost"


def _amount(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)


def field_problem(key: str, value: Any) -> str | None:
    """Why `value` is not a valid `key` of COST_FIELDS (for a registration's 400), or None."""
    if key == "cost_tier":
        return None if value in COST_TIERS else f"'cost_tier' must be one of {', '.join(COST_TIERS)}"
    if _amount(value) is None:
        unit = "milliseconds" if key == "latency_ms_hint" else "US dollars per million tokens"
        return f"'{key}' must be a number of {unit}, 0 or more"
    return None


def estimated_cost(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The valid cost fields of a model definition, in COST_FIELDS order; {} when it has none."""
    out: dict[str, Any] = {}
    for key in COST_FIELDS:
        if key in definition and field_problem(key, definition[key]) is None:
            value = definition[key]
            out[key] = value if key == "cost_tier" else float(value)
    return out


def prices(definition: Mapping[str, Any]) -> dict[str, float]:
    """The per-million-token prices alone, as `/v1/models` shows them."""
    return {k: v for k, v in estimated_cost(definition).items() if k in PRICE_FIELDS}


def with_cost(outputs: Mapping[str, Any], cost: Mapping[str, Any]) -> dict[str, Any]:
    """A decision's `outputs` with `estimated_cost` added: never over what the rule's author set
    under that key, and not at all when nothing is known of the candidate's cost."""
    merged = dict(outputs)
    if cost and OUTPUT_KEY not in merged:
        merged[OUTPUT_KEY] = dict(cost)
    return merged
