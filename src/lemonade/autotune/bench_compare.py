"""`lemonade bench --compare`: a run's figures against a saved one, as Lemonade's bench compares them.

Models are matched by name (a model only in this run is `new`, one only in the saved run `removed`);
within a model, scenarios are matched by recipe/backend, context size, argument set and scenario name
(and the auto-tune grid's parameters, which Lemonade's files do not have). Each scenario gets a
status: `matched` (with the change of mean TTFT and tokens/s in percent and of the memory peaks in
GB), `new`, `removed`, `failed` (every run of this run failed) or `prev_failed`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class CompareError(ValueError):
    """The saved results cannot be read; the message names the file."""


def load_previous(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CompareError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path} is not a bench results file (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or not (isinstance(data.get("models"), list) or isinstance(data.get("model"), str)):
        raise CompareError(f"{path} is not a bench results file (no 'models' array)")
    return data


def models_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> model entry (a single-model file of an older format is one entry)."""
    if isinstance(report.get("models"), list):
        return {m["model"]: m for m in report["models"] if isinstance(m, dict) and isinstance(m.get("model"), str)}
    return {report["model"]: report}


def _key(result: dict[str, Any], scenario: str) -> tuple[str, int, str, str, str]:
    params = json.dumps({k: v for k, v in (result.get("params") or {}).items() if v is not None}, sort_keys=True)
    return (f"{result.get('recipe', '')}/{result.get('backend', '')}", int(result.get("ctx_size") or 0),
            result.get("backend_args") or "", params, scenario)


def _pct(now: float, before: float) -> float:
    return round((now - before) / before * 100, 2) if before > 0 else 0.0


def _change(now: Any, before: Any) -> float | None:
    return round(now - before, 3) if isinstance(now, int | float) and isinstance(before, int | float) else None


def deltas(current: dict[str, Any], previous: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per scenario of either run (see the module doc)."""
    before: dict[tuple[str, int, str, str, str], dict[str, Any]] = {}
    for result in previous.get("results") or []:
        for s in result.get("scenarios") or []:
            before[_key(result, s.get("name", ""))] = s
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, int, str, str, str]] = set()
    for result in current.get("results") or []:
        for s in result.get("scenarios") or []:
            key = _key(result, s["name"])
            seen.add(key)
            delta = {"backend": key[0], "ctx_size": key[1], "backend_args": key[2], "scenario": key[4],
                     "ttft_pct_change": 0.0, "tps_pct_change": 0.0, "vram_gb_change": None,
                     "model_memory_gb_change": None}
            old = before.get(key)
            if s.get("all_runs_failed"):
                delta["status"] = "failed"
            elif old is None:
                delta["status"] = "new"
            elif old.get("all_runs_failed"):
                delta["status"] = "prev_failed"
            else:
                delta.update(status="matched",
                             ttft_pct_change=_pct(s["ttft_ms"]["mean"], (old.get("ttft_ms") or {}).get("mean", 0)),
                             tps_pct_change=_pct(s["tps"]["mean"], (old.get("tps") or {}).get("mean", 0)),
                             vram_gb_change=_change(s.get("vram_peak_gb"), old.get("vram_peak_gb")),
                             model_memory_gb_change=_change((s.get("model_memory_gb") or {}).get("peak"),
                                                            (old.get("model_memory_gb") or {}).get("peak")))
            out.append(delta)
    for key in before.keys() - seen:
        out.append({"backend": key[0], "ctx_size": key[1], "backend_args": key[2], "scenario": key[4],
                    "ttft_pct_change": 0.0, "tps_pct_change": 0.0, "vram_gb_change": None,
                    "model_memory_gb_change": None, "status": "removed"})
    return out


def model_summary(current: list[str], previous: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {"current_models": current, "previous_models": list(previous),
            "matched_models": [m for m in current if m in previous],
            "new_models": [m for m in current if m not in previous],
            "removed_models": [m for m in previous if m not in current]}


def compared(report: dict[str, Any], previous: dict[str, Any], compare_file: str) -> dict[str, Any]:
    """The report with the comparison added: at the top, the model sets and the saved run's time;
    per model, the saved results and the per-scenario deltas."""
    old = models_of(previous)
    out = {**report, "compare_file": compare_file,
           "model_summary": model_summary([m["model"] for m in report["models"]], old)}
    if isinstance(previous.get("timestamp"), str):
        out["previous_timestamp"] = previous["timestamp"]
    out["models"] = [{**m, "compare_file": compare_file, "previous_results": (old.get(m["model"]) or {}).get("results")
                      or [], "comparison": deltas(m, old.get(m["model"]) or {})} for m in report["models"]]
    return out
