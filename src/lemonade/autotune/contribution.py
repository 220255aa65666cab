"""`lemonade bench --submit`: the structured benchmark contribution of auto-tune.md, phase 3.

One JSON file holding what a curator needs to turn local measurements into a profile: the machine's
archetype (as the server detected it) and device data, the bench settings, every measured cell, the
stock cell and the best one per model, and a proposed profile in the bundled profiles' schema
(validated here, so it can be dropped into `autotune/profiles/` as it is). The proposal keeps only
settings that helped: a cell qualifies when none of its figures is worse than stock beyond
`TOLERANCE` and at least one is better by `MIN_GAIN`.
"""

from __future__ import annotations

import time
from typing import Any

from lemonade.autotune.bench import summary
from lemonade.autotune.profiles import SCHEMA_VERSION, validate
from lemonade.backends.tuning import params_to_options

SCHEMA = "lemonade-autotune-contribution/1"
TOLERANCE = 0.02   # a figure may be this much worse than stock and still count as "not slower"
MIN_GAIN = 0.05    # ... and one figure must be this much better to count as "helps"
# figure -> True when higher is better
FIGURES = {"tps_1": True, "tps_n": True, "ttft_ms": False, "ttft_ms_n": False}


def gains(stock: dict[str, Any], cell: dict[str, Any]) -> dict[str, float]:
    """Relative change of each figure against stock, signed so that positive = better."""
    out = {}
    for key, higher in FIGURES.items():
        a, b = stock.get(key), cell.get(key)
        if a and b:
            change = (b - a) / a
            out[key] = round(change if higher else -change, 4)
    return out


def helps(change: dict[str, float]) -> bool:
    return bool(change) and all(v >= -TOLERANCE for v in change.values()) and any(v >= MIN_GAIN
                                                                                   for v in change.values())


def best_cell(results: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None,
                                                      dict[str, float]]:
    """(stock result, best helping result or None, its gains) among one model's results."""
    ok = [r for r in results if "error" not in r]
    stock = next((r for r in ok if r.get("stock")), None)
    if stock is None:
        return None, None, {}
    base = summary(stock)
    scored = []
    for r in ok:
        if r is stock or r.get("backend") != stock.get("backend"):
            continue
        change = gains(base, summary(r))
        if helps(change):
            scored.append((sum(change.values()), r, change))
    if not scored:
        return stock, None, {}
    _, best, change = max(scored, key=lambda s: s[0])
    return stock, best, change


def contribution(report: dict[str, Any]) -> dict[str, Any]:
    """The contribution for a `lemonade bench` report (see module doc)."""
    tune = report.get("auto_tune") or {}
    archetype = tune.get("archetype") or {"id": "unknown"}
    models = []
    recipes: dict[str, Any] = {}
    for m in report.get("models", []):
        stock, best, change = best_cell(m["results"])
        entry: dict[str, Any] = {"model": m["model"], "checkpoint": m.get("checkpoint"), "recipe": m["recipe"],
                                 "stock": summary(stock) if stock else None,
                                 "best": None, "results": m["results"]}
        if best is not None:
            options = params_to_options(m["recipe"], best["params"])
            entry["best"] = {"backend": best.get("backend"), "params": best["params"], "options": options,
                             "figures": summary(best), "gain_vs_stock": change}
            overlay = recipes.setdefault(m["recipe"], {}).setdefault("models", {})
            overlay[m["model"]] = {best.get("backend") or "*": options}
        models.append(entry)
    proposed = None
    if recipes:
        proposed = {"schema_version": SCHEMA_VERSION, "archetype": archetype["id"],
                    "description": f"Measured on {report.get('machine', {}).get('Processor') or 'one machine'} "
                                   f"({archetype['id']})",
                    "source": f"lemonade bench --submit, {report.get('timestamp')}, lemonade "
                              f"{report.get('version')}; settings kept only where they beat stock",
                    "recipes": recipes}
        validate(proposed, "proposed profile")  # what we propose must load as a profile
    return {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "lemonade_version": report.get("version"), "archetype": archetype,
            "auto_tune_during_bench": {"enabled": tune.get("enabled"), "profiles": tune.get("profiles")},
            "machine": report.get("machine"), "bench_settings": report.get("settings"),
            "bench_timestamp": report.get("timestamp"),
            "rules": {"tolerance": TOLERANCE, "min_gain": MIN_GAIN, "figures": list(FIGURES)},
            "models": models, "proposed_profile": proposed}
