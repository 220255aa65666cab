"""`lemonade bench MODEL`: measure a model over a grid of backends and tuning parameters.

A client of the running server like every other command (the measuring is `autotune/bench.py`):
prints a table, writes the full figures as JSON, and with `--submit` the contribution file of the
auto-tune working group (a proposed profile for this machine's archetype, kept only where it beat
the stock settings)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, err, fail, out, require_server

GridOpt = Annotated[list[str] | None, typer.Option(metavar="N|default",
                                                    help="Value to try (repeat for several); "
                                                         "`default` = the engine's own")]


def _values(name: str, raw: list[str] | None) -> list[int | None] | None:
    if not raw:
        return None
    out_values: list[int | None] = []
    for text in raw:
        for part in text.split(","):
            part = part.strip()
            if part in ("default", "auto", ""):
                out_values.append(None)
            elif part.isdigit() and int(part) > 0:
                out_values.append(int(part))
            else:
                raise fail(f"--{name.replace('_', '-')} takes positive integers or `default`, got {part!r}",
                           EXIT_USAGE)
    return list(dict.fromkeys(out_values))


def _fmt(value: Any) -> str:
    return "-" if value is None else (f"{value:.1f}" if isinstance(value, float) else str(value))


def results_table(model: str, results: list[dict[str, Any]], streams: int) -> Table:
    from lemonade.autotune.bench import summary

    names = list(dict.fromkeys(k for r in results for k in r.get("params", {})))
    table = Table(title=f"lemonade bench {model}", title_justify="left")
    for col in ["Backend", *names, "TTFT ms", "tok/s", f"TTFT ms x{streams}", f"tok/s x{streams}", "RSS MB",
                "Load s"]:
        table.add_column(col, justify="left" if col == "Backend" else "right")
    for r in results:
        params = [_fmt(r["params"].get(n)) if r["params"].get(n) is not None else "[dim]default[/dim]" for n in names]
        if "error" in r:
            table.add_row(_fmt(r.get("backend")), *params, f"[red]{r['error'][:60]}[/red]", "", "", "", "", "")
            continue
        s = summary(r)
        table.add_row(_fmt(r.get("backend")) + (" [dim](stock)[/dim]" if r.get("stock") else ""), *params,
                      _fmt(s["ttft_ms"]), _fmt(s["tps_1"]), _fmt(s["ttft_ms_n"]), _fmt(s["tps_n"]),
                      _fmt(s["memory_mb"]), _fmt(s["load_seconds"]))
    return table


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def bench(
    models: Annotated[list[str], typer.Argument(metavar="MODEL_NAME...", help="Model(s) to benchmark")],
    backend: Annotated[list[str] | None, typer.Option(help="Backend to test (repeat for several); "
                                                      "default: every installed backend of the model's recipe")] = None,
    threads: GridOpt = None, batch: GridOpt = None, ubatch: GridOpt = None, parallel: GridOpt = None,
    ctx_size: GridOpt = None,
    runs: Annotated[int, typer.Option(min=1, help="Single-stream requests measured per setting")] = 3,
    warmup: Annotated[int, typer.Option(min=0, help="Requests before measuring (not counted)")] = 1,
    streams: Annotated[int, typer.Option(min=1, help="Concurrent streams of the multi-stream measurement")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per request")] = 64,
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Approximate prompt length in tokens")] = 256,
    output: Annotated[Path | None, typer.Option(help="JSON results file (default: "
                                                "lemonade-bench-MODEL-TIME.json here)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON instead of the table")] = False,
    submit: Annotated[bool, typer.Option("--submit", help="Also write the auto-tune contribution file "
                                         "(archetype, results, proposed profile)")] = False,
    submit_file: Annotated[Path | None, typer.Option(help="Where --submit writes (default: "
                                                     "lemonade-autotune-ARCHETYPE-MODEL-TIME.json here)")] = None,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Measure TTFT, tokens/s (1 and N streams) and memory over backends and tuning parameters.

    Every combination of the values given is loaded and measured, plus the stock settings first
    (no parameter given) that the others are compared with. Run it on a server with auto-tune off
    (`lemonade config set auto_tune=false`) to measure against the engine's own defaults."""
    from lemonade.autotune.bench import Bench, BenchSettings, grid
    from lemonade.autotune.contribution import contribution
    from lemonade.backends.tuning import tuning_params
    from lemonade.cli.target import api_key

    c = require_server(host, port)
    health = c.get("/v1/health")
    info = c.get("/v1/system-info")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    settings = BenchSettings(runs=runs, warmup=warmup, streams=streams, max_tokens=max_tokens,
                             prompt_tokens=prompt_tokens)
    given = {"threads": threads, "batch": batch, "ubatch": ubatch, "parallel": parallel, "ctx_size": ctx_size}
    report: dict[str, Any] = {"schema": "lemonade-bench/1", "timestamp": started, "server": c.url,
                              "version": health.get("version"), "auto_tune": health.get("auto_tune"),
                              "machine": {k: info.get(k) for k in ("OS Version", "Processor", "Physical Memory",
                                                                    "devices")},
                              "settings": settings.__dict__, "models": []}
    tune = health.get("auto_tune") or {}
    if tune.get("enabled") and tune.get("profiles"):
        err.print(f"[yellow]Auto-tune is on (profiles {', '.join(tune['profiles'])}): every row, the stock one "
                  "included, also gets the profile's settings the grid does not set (each row's launch_command "
                  "in the JSON shows what ran). For the engine's own defaults: lemonade config set "
                  "auto_tune=false[/yellow]", highlight=False)
    headers = {"Authorization": f"Bearer {api_key()}"} if api_key() else {}
    stamp = started.replace(":", "").replace("-", "")
    name = _slug("-".join(dict.fromkeys(models)))
    path = output or Path(f"lemonade-bench-{name}-{stamp}.json")
    for model in dict.fromkeys(models):
        meta = c.get(f"/v1/models/{model}")
        recipe = meta.get("recipe", "")
        known = tuning_params(recipe)
        values: dict[str, list[int | None]] = {}
        for name, raw in given.items():
            parsed = _values(name, raw)
            if parsed is None:
                continue
            if name not in known:
                raise fail(f"--{name.replace('_', '-')}: model {model} (recipe {recipe}) has no such tuning "
                           f"parameter; it has: {', '.join(known) or 'none'}", EXIT_USAGE)
            values[name] = parsed
        installed = [b for b, st in ((info.get("recipes") or {}).get(recipe, {}).get("backends") or {}).items()
                     if isinstance(st, dict) and st.get("state") == "installed"]
        cells = grid(list(backend or installed or [None]), values)  # default: every installed backend
        err.print(f"Benchmarking {model}: {len(cells)} setting(s), {runs} run(s) + {streams} streams each",
                  highlight=False)
        runner = Bench(c.url, model, recipe, settings, headers,
                       progress=lambda msg: err.print(f"  {msg}", highlight=False))
        entry = {"model": model, "checkpoint": meta.get("checkpoint"), "recipe": recipe,
                 "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": []}
        report["models"].append(entry)
        # The file is rewritten after each setting, so an interrupted run keeps what it measured.
        def saved(done: list[dict[str, Any]], e: dict[str, Any] = entry) -> None:
            e.update(results=list(done))
            _write(path, report)

        results = runner.run(cells, on_result=saved)
        c.post("/v1/unload", {"model_name": model})
        if not as_json:
            out.print(results_table(model, results, streams))
    _write(path, report)
    if as_json:
        out.print_json(json.dumps(report))
    err.print(f"Results written to {path}", highlight=False)
    if submit:
        sub = contribution(report)
        target = submit_file or Path(f"lemonade-autotune-{_slug(sub['archetype']['id'])}-{name}-{stamp}.json")
        _write(target, sub)
        err.print(f"Contribution written to {target}: attach it to an auto-tune profile pull request or issue "
                  "(the proposed profile keeps only settings that beat stock here)", highlight=False)
    if any("error" in r for m in report["models"] for r in m["results"]):
        raise typer.Exit(1)


def _write(path: Path, data: dict[str, Any]) -> None:
    from lemonade.util.atomic import atomic_write_json

    atomic_write_json(path, data)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
