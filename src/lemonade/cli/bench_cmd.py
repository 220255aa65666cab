"""`lemonade bench MODEL_NAME...`: Lemonade's benchmark, plus auto-tune's grid and contribution.

A client of the running server like every other command (the measuring is `autotune/bench.py`, the
scenarios `autotune/scenarios.py`, the comparison `autotune/bench_compare.py`). As Lemonade's (guide-cli.md,
"Options for bench"): scenario files, installed backends, context sizes and argument sets, a table or
JSON, `--compare` against a saved run, `--auto-pull`, `--no-reload`, `--response-log`. Ours besides:
the model's own memory beside the speed, the auto-tune grid (`--threads`, `--batch`, `--ubatch`,
`--parallel`), concurrent streams (`--streams`) and `--submit`, the contribution file of the
auto-tune working group (a proposed profile for this machine's archetype, kept only where it beat
the stock settings)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, err, fail, out, require_server

if TYPE_CHECKING:
    from lemonade.autotune.bench import Setting
    from lemonade.autotune.scenarios import Scenario

GridOpt = Annotated[list[str] | None, typer.Option(metavar="N|default",
                                                    help="Auto-tune grid: value to try (repeat for several); "
                                                         "`default` = the engine's own")]
ArgsOpt = Annotated[list[str] | None, typer.Option(metavar="ARGS")]
# Options that take several values after one flag, as Lemonade's CLI (CLI11) reads them:
# `--ctx-size 4096 8192`, `--llamacpp-args "-b 1024" "-b 2048"`. Click takes one value per flag, so
# `repeat_multi_values` turns them into repeated flags before it parses (cli/main.py).
MULTI_INT = ("--ctx-size",)
MULTI_ARGS = ("--llamacpp-args", "--whispercpp-args", "--sdcpp-args", "--vllm-args")


def repeat_multi_values(argv: list[str]) -> list[str]:
    """`bench ... --ctx-size 4096 8192 M` -> `... --ctx-size 4096 --ctx-size 8192 M`; an argument set is
    a value that starts with `-` and is not one of bench's own options."""
    known = {"--" + p.replace("_", "-") for p in bench.__code__.co_varnames[:bench.__code__.co_argcount]}
    known |= {"--json", "--no-memory", "--no-reload", "--auto-pull", "--submit", "--help"}
    out_args: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        out_args.append(arg)
        i += 1
        if arg in MULTI_INT + MULTI_ARGS and i < len(argv):
            out_args.append(argv[i])
            i += 1
            while i < len(argv) and (re.fullmatch(r"\d+", argv[i]) if arg in MULTI_INT
                                     else argv[i].startswith("-") and argv[i].split("=")[0] not in known):
                out_args += [arg, argv[i]]
                i += 1
    return out_args


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


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_table(entry: dict[str, Any], percentiles: bool) -> None:
    """Lemonade's table (per setting: TTFT and tokens/s, mean and min/max or p50/p95 from 10 runs,
    VRAM peak) with the model's own memory peak beside it."""
    from rich.table import Table

    lo, hi = ("p50", "p95") if percentiles else ("min", "max")
    out.print(f"\nBenchmark: {entry['model']}", highlight=False)
    for result in entry["results"]:
        title = f"Backend: {result['label']}"
        if "error" in result:
            out.print(f"{title}\n  [red]{result['error']}[/red]", highlight=False)
            continue
        table = Table(title=title, title_justify="left")
        for col in ("Scenario", "TTFT ms", lo, hi, "TPS", lo, hi, "VRAM (GB)", "Model mem (GB)"):
            table.add_column(col, justify="left" if col == "Scenario" else "right")
        for s in result["scenarios"]:
            name = s["name"] + (f" *{s['failed_runs']}f" if s.get("failed_runs") else "")
            if s.get("all_runs_failed"):
                table.add_row(name, *["-"] * 8)
                continue
            ttft, tps = s["ttft_ms"], s["tps"]
            table.add_row(name, _fmt(ttft["mean"]), _fmt(ttft[lo]), _fmt(ttft[hi]), _fmt(tps["mean"]), _fmt(tps[lo]),
                          _fmt(tps[hi]), _fmt(s.get("vram_peak_gb"), 2),
                          _fmt((s.get("model_memory_gb") or {}).get("peak"), 2))
        out.print(table)
        extra = [f"load {_fmt(result.get('load_seconds'), 2)} s",
                 f"context {result.get('context_length') or '-'}",
                 f"memory estimate {_fmt(result.get('memory_estimate_gb'), 2)} GB"]
        concurrent = result.get("concurrent") or {}
        if concurrent.get("tokens_per_s") is not None:
            extra.append(f"{concurrent['streams']} streams: {_fmt(concurrent['tokens_per_s'])} tokens/s, "
                         f"TTFT p50 {_fmt(concurrent['ttft_ms']['p50'])} ms")
        elif concurrent.get("error"):
            extra.append(f"{concurrent['streams']} streams failed: {concurrent['error']}")
        out.print("  " + "; ".join(extra), highlight=False)
    out.print("(*Nf = N failed runs left out of the figures)", highlight=False)


def print_comparison(entry: dict[str, Any], compare_file: str, previous_timestamp: str | None) -> None:
    from rich.table import Table

    out.print(f"\nComparison: {entry['model']}\nPrevious: {compare_file}"
              f"{f' ({previous_timestamp})' if previous_timestamp else ''}", highlight=False)
    groups: dict[str, list[dict[str, Any]]] = {}
    for d in entry["comparison"]:
        label = d["backend"] + (f" (ctx={d['ctx_size']})" if d["ctx_size"] else "") + (
            f" args=[{d['backend_args']}]" if d["backend_args"] else "")
        groups.setdefault(label, []).append(d)
    for label, rows in groups.items():
        table = Table(title=f"Backend: {label}", title_justify="left")
        for col in ("Scenario", "TTFT change", "TPS change", "VRAM change", "Model mem change", "Status"):
            table.add_column(col, justify="left" if col in ("Scenario", "Status") else "right")
        for d in rows:
            matched = d["status"] == "matched"
            table.add_row(d["scenario"], f"{d['ttft_pct_change']:+.1f}%" if matched else "-",
                          f"{d['tps_pct_change']:+.1f}%" if matched else "-",
                          _gb_change(d["vram_gb_change"]) if matched else "-",
                          _gb_change(d["model_memory_gb_change"]) if matched else "-", f"({d['status']})")
        out.print(table)
    out.print("TTFT change > 0 means slower (worse); TPS change > 0 means faster (better).", highlight=False)


def _gb_change(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f} GB"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def bench(
    models: Annotated[list[str], typer.Argument(metavar="MODEL_NAME...", help="Model(s) to benchmark "
                                                "(each once, in the order given)")],
    backend: Annotated[list[str] | None, typer.Option(help="Backend to test (repeat for several); "
                                                      "default: every installed backend of the model's recipe")] = None,
    ctx_size: Annotated[list[int] | None, typer.Option("--ctx-size", metavar="SIZE", min=1,
                                                       help="Context size to test (several allowed); "
                                                            "default: the model's own")] = None,
    runs: Annotated[int | None, typer.Option(min=1, help="Measured runs per scenario (default: the "
                                             "scenario's, 3)")] = None,
    warmup: Annotated[int | None, typer.Option(min=0, help="Warm-up runs per scenario, not measured "
                                               "(default: the scenario's, 0)")] = None,
    scenarios: Annotated[list[str] | None, typer.Option("--scenarios", metavar="NAME|CATEGORY",
                                                        help="Scenario name or category (repeat; `all` for "
                                                             "every one); default: all but long-context, embed, "
                                                             "vision and imagegen")] = None,
    scenario_file: Annotated[Path | None, typer.Option(help="Load scenarios from this JSON file")] = None,
    scenario_dir: Annotated[Path | None, typer.Option(help="Load every .json scenario file of this folder")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Output the results as JSON instead of a table")] = False,
    output: Annotated[Path | None, typer.Option(help="Also write the JSON results to this file (rewritten "
                                                "after each setting, so an interrupted run keeps them)")] = None,
    compare: Annotated[Path | None, typer.Option(help="Compare against a previously saved JSON file")] = None,
    auto_pull: Annotated[bool, typer.Option("--auto-pull", help="Pull models that are not downloaded first")] = False,
    no_memory: Annotated[bool, typer.Option("--no-memory", help="Do not read memory after each run")] = False,
    no_reload: Annotated[bool, typer.Option("--no-reload", help="Load once per setting instead of before "
                                            "every run (faster; the prompt cache may flatter later runs)")] = False,
    response_log: Annotated[Path | None, typer.Option(help="Append each answer to this JSONL file "
                                                      "(for judging quality later)")] = None,
    llamacpp_args: ArgsOpt = None, whispercpp_args: ArgsOpt = None, sdcpp_args: ArgsOpt = None,
    vllm_args: ArgsOpt = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds a request may take")] = 300,
    threads: GridOpt = None, batch: GridOpt = None, ubatch: GridOpt = None, parallel: GridOpt = None,
    streams: Annotated[int | None, typer.Option(min=1, help="Also measure N concurrent streams per setting "
                                                "(default 8 with --submit, else none)")] = None,
    submit: Annotated[bool, typer.Option("--submit", help="Also write the auto-tune contribution file "
                                         "(archetype, results, proposed profile)")] = False,
    submit_file: Annotated[Path | None, typer.Option(help="Where --submit writes (default: "
                                                     "lemonade-autotune-ARCHETYPE-MODEL-TIME.json here)")] = None,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Measure TTFT, tokens/s and memory over scenarios, backends, context sizes and argument sets.

    Each setting (backend x context size x argument set x auto-tune grid point, the stock one first)
    is loaded afresh and runs every chosen scenario. Argument sets are the engine's own flags for the
    load (`--llamacpp-args "-b 1024" "-b 2048"`), replacing the server's. Run on a server with
    auto-tune off (`lemonade config set auto_tune=false`) to measure against the engine's defaults."""
    from lemonade.autotune.bench import Bench, BenchError
    from lemonade.autotune.bench_compare import CompareError, compared, load_previous
    from lemonade.autotune.scenarios import ScenarioError

    try:
        chosen = _scenarios(scenario_file, scenario_dir, scenarios)
        previous = load_previous(compare) if compare else None
    except (ScenarioError, CompareError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    grid = {name: parsed for name, raw in (("threads", threads), ("batch", batch), ("ubatch", ubatch),
                                           ("parallel", parallel)) if (parsed := _values(name, raw)) is not None}
    # Each flag is named for an engine's `*_args` option (the engine description says which is its own).
    arg_sets = {"llamacpp_args": llamacpp_args, "whispercpp_args": whispercpp_args, "sdcpp_args": sdcpp_args,
                "vllm_args": vllm_args}
    streams = streams or (8 if submit else 0)
    unique = list(dict.fromkeys(models))
    if len(unique) < len(models):
        err.print(f"Note: {len(models) - len(unique)} duplicate model name(s) left out; benchmarking "
                  f"{len(unique)} model(s).", highlight=False)

    c = require_server(host, port)
    metas = {model: _preflight(c, model, auto_pull) for model in unique}
    health = c.get("/v1/health")
    info = c.get("/v1/system-info")
    # Every model's plan before anything runs: a usage mistake about the second model stops the first too.
    plans = {model: _plan(model, metas[model], info, chosen, backend, ctx_size, grid, arg_sets) for model in unique}
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if response_log is not None:
        response_log.parent.mkdir(parents=True, exist_ok=True)
    machine = {k: info.get(k) for k in ("OS Version", "Processor", "Physical Memory", "devices")}
    report: dict[str, Any] = {
        "schema": "lemonade-bench/2", "timestamp": started, "server": c.url, "version": health.get("version"),
        "hardware": {**machine, "lemonade_version": health.get("version")}, "auto_tune": health.get("auto_tune"),
        "machine": machine, "settings": {"runs": runs, "warmup": warmup, "reload": not no_reload,
                                         "memory_tracking": not no_memory, "streams": streams,
                                         "scenarios": [s.name for s in chosen]},
        "models": []}
    tune = health.get("auto_tune") or {}
    if tune.get("enabled") and tune.get("profiles"):
        err.print(f"[yellow]Auto-tune is on (profiles {', '.join(tune['profiles'])}): every setting, the stock one "
                  "included, also gets the profile's flags that it does not set itself (each result's "
                  "launch_command shows what ran). For the engine's own defaults: lemonade config set "
                  "auto_tune=false[/yellow]", highlight=False)
    failures = False
    for model, (recipe, runnable, todo) in plans.items():
        runner = Bench(c.url, model, recipe, headers=dict(c.headers), timeout=timeout, memory=not no_memory,
                       reload=not no_reload, response_log=response_log, timestamp=started,
                       progress=lambda msg: err.print(msg, highlight=False, markup=False))
        entry: dict[str, Any] = {"model": model, "checkpoint": metas[model].get("checkpoint"), "recipe": recipe,
                                 "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "config": {"warmup_runs": warmup or 0, "measurement_runs": runs or 3,
                                            "memory_tracking": not no_memory},
                                 "results": []}
        report["models"].append(entry)
        err.print(f"Benchmarking {model}: {len(todo)} setting(s) x {len(runnable)} scenario(s)", highlight=False)
        for setting in todo:
            try:
                result = runner.run_setting(setting, runnable, warmup, runs, streams)
            except BenchError as exc:
                result = {"recipe": recipe, "backend": setting.backend, "error": str(exc)}
            result["label"] = setting.label(recipe)
            entry["results"].append(result)
            failures |= "error" in result or any(s.get("all_runs_failed") for s in result.get("scenarios", []))
            if output is not None:  # rewritten after each setting: an interrupted run keeps what it has
                _write(output, report)
        c.post("/v1/unload", {"model_name": model})
    final = compared(report, previous, str(compare)) if previous is not None else report
    _show(final, as_json, output, percentiles=(runs or 3) >= 10, compare_file=str(compare) if compare else None)
    if submit:
        _submit(report, submit_file, unique, started)
    if failures:
        raise typer.Exit(1)


def _scenarios(scenario_file: Path | None, scenario_dir: Path | None, tokens: list[str] | None) -> list[Scenario]:
    """The scenarios asked for: of a file, a folder or the bundled set, selected by `--scenarios`."""
    from lemonade.autotune.scenarios import bundled, load_dir, load_file, select

    if scenario_file and scenario_dir:
        raise fail("give --scenario-file or --scenario-dir, not both", EXIT_USAGE)
    if scenario_file:
        found = load_file(scenario_file)
    elif scenario_dir:
        found, warnings = load_dir(scenario_dir)
        for warning in warnings:
            err.print(f"[yellow]Warning: {warning}[/yellow]", highlight=False)
    else:
        found = bundled()
    chosen = select(found, tokens)
    if not chosen:
        raise fail("no scenario to run (the scenario file has none of the default categories; name some with "
                   "--scenarios)", EXIT_USAGE)
    return chosen


def _plan(model: str, meta: dict[str, Any], info: dict[str, Any], chosen: list[Scenario], backends: list[str] | None,
          ctx_sizes: list[int] | None, grid: dict[str, list[int | None]],
          arg_sets: dict[str, list[str] | None]) -> tuple[str, list[Scenario], list[Setting]]:
    """(recipe, the scenarios that suit the model, its settings); a usage error when the grid names a
    parameter its engine lacks or no scenario suits it."""
    from lemonade.autotune.bench import settings
    from lemonade.autotune.scenarios import suits
    from lemonade.backends.tuning import args_option, tuning_params

    recipe = meta.get("recipe", "")
    for name in grid:
        if name not in tuning_params(recipe):
            raise fail(f"--{name}: model {model} (recipe {recipe}) has no such tuning parameter; it has: "
                       f"{', '.join(tuning_params(recipe)) or 'none'}", EXIT_USAGE)
    own = args_option(recipe)
    for option, given in arg_sets.items():
        if given and option != own:
            err.print(f"[yellow]--{option.replace('_', '-')} does not apply to {model} (recipe {recipe})[/yellow]",
                      highlight=False)
    labels = set(meta.get("labels") or [])
    runnable = [s for s in chosen if suits(s, labels)]
    named = ", ".join(sorted(labels)) or "none"
    for s in chosen:
        if s not in runnable:
            err.print(f"Skipping scenario {s.name} ({s.category}): not suitable for {model} (labels: {named})",
                      highlight=False, markup=False)
    if not runnable:
        raise fail(f"none of the chosen scenarios suits {model} (labels: {named}); choose others with --scenarios, "
                   "e.g. --scenarios embed for an embedding model", EXIT_USAGE)
    installed = [b for b, st in ((info.get("recipes") or {}).get(recipe, {}).get("backends") or {}).items()
                 if isinstance(st, dict) and st.get("state") in ("installed", "update_available")]
    todo = settings(list(backends or installed or [None]), list(ctx_sizes or []),
                    list(arg_sets.get(own or "") or []), grid)
    return recipe, runnable, todo


def _show(final: dict[str, Any], as_json: bool, output: Path | None, percentiles: bool,
          compare_file: str | None) -> None:
    """As Lemonade's: JSON to stdout, or to `--output` alone; else the tables (and the comparison),
    with the JSON also in `--output`."""
    if output is not None:
        _write(output, final)
    if as_json:
        if output is None:
            out.print_json(json.dumps(final))
        else:
            err.print(f"Results written to {output}", highlight=False)
        return
    for entry in final["models"]:
        print_table(entry, percentiles)
        if compare_file is not None:
            print_comparison(entry, compare_file, final.get("previous_timestamp"))
    if output is not None:
        err.print(f"JSON results also written to {output}", highlight=False)


def _preflight(c: Any, model: str, auto_pull: bool) -> dict[str, Any]:
    """The model's catalog entry once it is downloaded; without `--auto-pull`, a missing or
    not-downloaded model stops the command before anything runs (Lemonade's preflight)."""
    resp = c.http.get(f"/v1/models/{model}")
    if resp.status_code == 404 and not auto_pull:
        raise fail(f"Model '{model}' not found. Use --auto-pull to pull missing models before benchmarking.")
    meta = resp.json() if resp.status_code == 200 else {}
    if resp.status_code not in (200, 404):
        raise fail(f"Model '{model}': HTTP {resp.status_code}: {resp.text[:300]}")
    if meta.get("downloaded") is False or resp.status_code == 404:
        if not auto_pull:
            raise fail(f"Model '{model}' is not downloaded. Run `lemonade pull {model}` first, or use --auto-pull.")
        from lemonade.cli.models_cmd import run_pull

        err.print(f"Preflight: model '{model}' is not downloaded; pulling it.", highlight=False)
        c.timeout = None
        run_pull(c, {"model_name": model}, to=err)
        meta = c.get(f"/v1/models/{model}")
    return meta


def _submit(report: dict[str, Any], target: Path | None, models: list[str], stamp: str) -> None:
    from lemonade.autotune.contribution import contribution

    sub = contribution(report)
    name = _slug("-".join(models))
    target = target or Path(f"lemonade-autotune-{_slug(sub['archetype']['id'])}-{name}-"
                            f"{stamp.replace(':', '').replace('-', '')}.json")
    _write(target, sub)
    err.print(f"Contribution written to {target}: attach it to an auto-tune profile pull request or issue "
              "(the proposed profile keeps only settings that beat stock here)", highlight=False)


def _write(path: Path, data: dict[str, Any]) -> None:
    from lemonade.util.atomic import atomic_write_json

    atomic_write_json(path, data)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
