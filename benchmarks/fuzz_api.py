"""Fuzz every operation of `/openapi.json` with schemathesis against a real server and a real model.

Why: the tests check the bad inputs we thought of; a generator finds the ones we did not. The
server runs as in production (a `lemonade serve` subprocess, the real `llama-server`, the real
Gemma 3 270M as `gemma-3-270m-q4_k_m`) but in a throwaway cache dir, because fuzzing
`/v1/delete`, `/v1/uninstall`, `/internal/set` and friends is destructive. The hub is offline
and `HF_ENDPOINT` points at a closed loopback port, so no request ever reaches the internet.

Checks on every response: no 5xx, the status code and content type are documented, the body
matches the documented schema, schema-violating input is refused with a 4xx, and no answer names
a path of the server's folders unless the client asked for one (PATHS_ASKED_FOR). It prints
figures (operations, requests, 5xx, violations by operation) and exits non-zero on any
violation; anything not fuzzed is printed with the reason. Results: docs/reliability.md.

    .venv/bin/pip install -e '.[fuzz]'
    .venv/bin/python benchmarks/fuzz_api.py [--examples 30] [--all-prefixes] [--only /v1/load]

Every process it starts is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_serving import (  # noqa: E402 - needs the repo root on sys.path first
    GEMMA_NAME,
    Processes,
    backend_dir,
    free_port,
    gemma_dir,
    lemonade_env,
    new_cache,
    serve_argv,
    wait_ok,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
# `positive_data_acceptance` is left out on purpose: a schema-valid body naming a model that does
# not exist is rightly a 404, so "valid input must be accepted" cannot hold for this API.
OTHER_PREFIXES = ("/api/v1/", "/v0/", "/api/v0/")
# Body fields that make a request start real, long work (an engine build or a venv install) or
# undo the setup the fuzz run needs; cases carrying such a value for them are not sent (counted).
PROTECTED_RECIPE_ROUTES = ("/v1/install", "/v1/uninstall")
# Where an answer may name a path under the run's folder because the client asked for it (with why).
_EXTRA_FILE = "an extra-dir model's file by absolute path, when include_paths=true is sent"
_ADMIN = "(no key is set in this run, so every caller is the admin, who sees this machine's paths)"
PATHS_ASKED_FOR = {
    "GET /v1/system-info": "model_storage.path (spec) " + _ADMIN, "GET /internal/config": "the settings (admin)",
    "POST /internal/set": "answers with the settings (admin)", "GET /v1/models": _EXTRA_FILE,
    "GET /v1/params": "the settings " + _ADMIN,
    "GET /v1/models/{model_id}": _EXTRA_FILE, "GET /v1/health": "a loaded model's launch_command " + _ADMIN,
    "GET /v1/models/{model_id}/files": "the model's files, asked for",
    "POST /v1/load": "an extra-dir model's checkpoint by absolute path " + _ADMIN,
    "DELETE /api/delete": "the refusal to delete a user's extra-dir file names it",
    "POST /v1/delete": "the refusal to delete a user's extra-dir file names it",
}
REQUEST_TIMEOUT = 120.0
# A small context bounds every generation (a request without `max_tokens` runs until the context
# is full): 256 tokens take seconds, even on two busy cores.
CTX_SIZE = 256
MODEL_FIELDS = ("model", "model_name", "model_id", "name")
# In the cases aimed at the real model, the token budget is at most MAX_TOKENS (set when absent):
# a fuzzed `max_tokens: 10**9` is valid and honoured, and on two busy cores even a context's worth
# of tokens takes minutes; the rest of the body stays as generated. Route -> budget field.
TOKEN_BUDGETS = {"/v1/chat/completions": ("max_tokens",), "/v1/completions": ("max_tokens",),
                 "/v1/responses": ("max_output_tokens",), "/v1/messages": ("max_tokens",),
                 "/api/chat": ("options", "num_predict"), "/api/generate": ("options", "num_predict")}
MAX_TOKENS = 8
# 501s the spec prescribes: a documented outcome, not a server fault. These operations are still
# fuzzed and schema-checked; their 501s are counted apart from the 5xx figure.
_OLLAMA_501 = "ollama.md: not supported, returns 501"
SPEC_501 = {"/api/create": _OLLAMA_501, "/api/copy": _OLLAMA_501, "/api/push": _OLLAMA_501,
            "/api/blobs/{digest}": _OLLAMA_501}


def canonical(label: str) -> str:
    """`POST /api/v0/slots/{slot_id}` -> `POST /v1/slots/{slot_id}`: the prefixes share one handler."""
    method, path = label.split(" ", 1)
    for prefix in OTHER_PREFIXES:
        if path.startswith(prefix):
            return f"{method} /v1/{path[len(prefix):]}"
    return label


@dataclass
class Figures:
    """What the run saw, per operation."""

    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    statuses: dict[str, collections.Counter[int]] = field(default_factory=lambda: collections.defaultdict(
        collections.Counter))
    violations: dict[str, collections.Counter[str]] = field(default_factory=lambda: collections.defaultdict(
        collections.Counter))
    examples: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))
    filtered: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: collections.Counter[str] = field(default_factory=collections.Counter)
    excluded: dict[str, str] = field(default_factory=dict)

    def server_errors(self) -> int:
        """5xx answers, less the 501s the spec prescribes (SPEC_501)."""
        return sum(n for label, counts in self.statuses.items() for code, n in counts.items()
                   if code >= 500 and not (code == 501 and canonical(label).split(" ", 1)[1] in SPEC_501))


def start_server(procs: Processes, root: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """`lemonade serve` in a throwaway cache, with a hard link (or copy) of Gemma in its own models dir."""
    cache = new_cache(root, "cache", backend_dir())
    models = root / "models"
    models.mkdir()
    source = next(gemma_dir().glob("*.gguf"))
    try:
        os.link(source, models / source.name)  # `/v1/delete` may remove it: never the shared file itself
    except OSError:
        shutil.copy2(source, models / source.name)
    (cache / "config.json").write_text(json.dumps({"ctx_size": CTX_SIZE}))
    env = lemonade_env(cache, models)
    env.update({"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "LEMONADE_OFFLINE": "true"})
    port = free_port()
    proc = procs.start(serve_argv(port), env=env, log=root / "server.log")
    url = f"http://127.0.0.1:{port}"
    wait_ok(url + "/live", proc, timeout=60)
    return proc, url, cache


def protected_recipes(url: str) -> set[str]:
    """Recipes the machine has installed: installing (forced) or uninstalling them would rebuild or
    remove the shared test backends (the throwaway cache links them)."""
    info = httpx.get(url + "/v1/system-info", timeout=30).json()
    return {name for name, recipe in info.get("recipes", {}).items()
            if any(b.get("state") == "installed" for b in recipe.get("backends", {}).values())}


def strategy_for(op: Any) -> Any:
    """Schema-valid and schema-violating cases for one operation (negative only where it can exist)."""
    positive = op.as_strategy(generation_mode=GenerationMode.POSITIVE)
    try:
        return st.one_of(positive, op.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    except Exception:  # noqa: BLE001 - an operation without parameters has no negative cases
        return positive


def aim_at_model(case: Any) -> None:
    """Name the real model in a schema-valid case: random names only reach the 404 path, while the
    real one sends the rest of the fuzzed body through the router to llama-server."""
    if isinstance(case.body, dict):
        for key in MODEL_FIELDS:
            if isinstance(case.body.get(key), str):
                case.body[key] = GEMMA_NAME
        *parents, field = TOKEN_BUDGETS.get(case.operation.path, (None,))
        node: Any = case.body
        for parent in parents:
            node = node.setdefault(parent, {}) if isinstance(node, dict) else None
        budget = node.get(field) if isinstance(node, dict) and field else None
        if isinstance(node, dict) and field and (budget is None or (isinstance(budget, int) and budget > MAX_TOKENS)):
            node[field] = MAX_TOKENS
    for key in MODEL_FIELDS:
        if isinstance((case.path_parameters or {}).get(key), str):
            case.path_parameters[key] = GEMMA_NAME


def fuzz_operation(op: Any, url: str, root: Path, figures: Figures, examples: int,
                   keep: Callable[[Any], bool], after: Callable[[], None]) -> None:
    """Send `examples` generated cases to one operation, recording every status and violation.

    Failures are recorded, not raised, so hypothesis does not stop or shrink: one run gives the
    figures for every operation.
    """
    label = op.label
    sent = 0

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, print_blob=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy_for(op))
    def run(case: Any) -> None:
        nonlocal sent
        if not keep(case):
            figures.filtered[label] += 1
            return
        sent += 1
        if sent % 2 == 0 and case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE:
            aim_at_model(case)  # schema-violating cases go out as generated, so "accepted" stays meaningful
        try:
            response = case.call(base_url=url, timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a dropped connection or timeout is a finding too
            figures.violations[label][f"transport: {type(exc).__name__}"] += 1
            figures.examples[label].append(f"{type(exc).__name__}: {exc}")
            return
        figures.requests[label] += 1
        figures.statuses[label][response.status_code] += 1
        spec_501 = canonical(label).split(" ", 1)[1] in SPEC_501 and response.status_code == 501
        try:
            case.validate_response(response, checks=CHECKS, excluded_checks=[not_a_server_error] if spec_501 else [])
        except FailureGroup as group:
            for failure in group.exceptions:
                figures.violations[label][failure.title] += 1
                if len(figures.examples[label]) < 3:
                    figures.examples[label].append(
                        f"{failure.title}: {response.status_code} {response.text[:300]!r}\n      "
                        f"{case.as_curl_command()[:600]}")
        except AssertionError as exc:
            figures.violations[label][type(exc).__name__] += 1
        if str(root) in response.text and canonical(label) not in PATHS_ASKED_FOR:
            figures.violations[label]["filesystem path disclosed"] += 1
            if len(figures.examples[label]) < 3:
                figures.examples[label].append(f"path disclosed: {response.status_code} {response.text[:300]!r}")
        after()

    started = time.monotonic()
    run()
    figures.seconds[label] += time.monotonic() - started


def report(figures: Figures, started: float, args: argparse.Namespace, commit: str) -> bool:
    """Print the figures; True when the run found nothing."""
    ops = sorted(figures.requests.keys() | figures.filtered.keys() | figures.violations.keys())
    total = sum(figures.requests.values())
    print(f"\n== fuzz figures ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
          f"schemathesis {schemathesis.SCHEMATHESIS_VERSION}, {args.examples} examples/operation, "
          f"{time.monotonic() - started:.0f} s)")
    print(f"operations fuzzed: {len(ops)}   requests: {total}   5xx: {figures.server_errors()}   "
          f"violations: {sum(sum(v.values()) for v in figures.violations.values())}")
    print(f"{'operation':<48} {'requests':>8} {'seconds':>7}  statuses")
    for label in ops:
        codes = " ".join(f"{code}:{n}" for code, n in sorted(figures.statuses[label].items()))
        note = f"  (+{figures.filtered[label]} not sent, see below)" if figures.filtered[label] else ""
        print(f"{label:<48} {figures.requests[label]:>8} {figures.seconds[label]:>7.1f}  {codes}{note}")
    if figures.violations:
        print("\n-- violations by operation")
        for label, kinds in sorted(figures.violations.items()):
            print(f"{label}: " + ", ".join(f"{kind} x{n}" for kind, n in kinds.most_common()))
            for example in figures.examples[label]:
                print(f"    {example}")
    print("\n-- 501 answers the spec prescribes (not counted as 5xx; under every prefix)")
    for path, why in SPEC_501.items():
        print(f"{path}: {why}")
    print("\n-- paths of the server's folders allowed in answers (asked for; under every prefix)")
    for label, why in PATHS_ASKED_FOR.items():
        print(f"{label}: {why}")
    print("\n-- not fuzzed, with the reason")
    for what, why in figures.excluded.items():
        print(f"{what}: {why}")
    if figures.filtered:
        print("cases not sent: " + ", ".join(f"{label} x{n}" for label, n in figures.filtered.items())
              + " (their recipe is installed on this machine: a forced install would rebuild it, an uninstall "
              "would remove the engine the rest of the run needs)")
    return not figures.violations and figures.server_errors() == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=30, help="generated cases per operation")
    parser.add_argument("--all-prefixes", action="store_true",
                        help="also fuzz the /api/v1, /v0 and /api/v0 copies of every /v1 route")
    parser.add_argument("--only", action="append", default=[], help="fuzz only paths starting with this")
    args = parser.parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally block stops every process we started

    signal.signal(signal.SIGTERM, on_term)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "unknown"
    started = time.monotonic()
    figures = Figures()
    procs = Processes()
    root = Path(tempfile.mkdtemp(prefix="lemonade-fuzz-"))
    try:
        proc, url, cache = start_server(procs, root)
        recipes = protected_recipes(url)
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        figures.excluded["WebSocket /logs/stream (and under every prefix)"] = (
            "not in OpenAPI (WebSocket); its auth and errors are tested in tests/test_foundation.py")
        figures.excluded["GET, DELETE /mcp"] = "not in OpenAPI (405 by design, MCP streamable HTTP); tests/test_mcp.py"

        def keep(case: Any) -> bool:
            if case.operation.path in PROTECTED_RECIPE_ROUTES and isinstance(case.body, dict):
                recipe = case.body.get("recipe")
                return not (isinstance(recipe, str) and recipe in recipes)
            return True

        settings_before = httpx.get(url + "/internal/config", timeout=30).json()

        def restore_settings() -> None:
            """Put the settings back after each `/internal/set` and `/v1/params` case, so later operations
            still find the model servable (a fuzzed `llamacpp.backend` would otherwise refuse every load;
            a persisted setting also replaces a live one)."""
            httpx.post(url + "/internal/set", json=settings_before, timeout=30).raise_for_status()

        for result in schema.get_all_operations():
            op = result.ok()
            if op is None:
                figures.excluded[str(result)] = "schemathesis could not read the operation"
                continue
            if args.only and not any(op.path.startswith(p) for p in args.only):
                continue
            if op.path == "/internal/shutdown":
                figures.excluded[op.label] = "stops the server it fuzzes; tests/test_shutdown.py"
                continue
            if not args.all_prefixes and op.path.startswith(OTHER_PREFIXES):
                figures.excluded.setdefault(
                    "/api/v1/*, /v0/*, /api/v0/* copies",
                    "the same handlers as /v1/* (one router mounted four times; tests/test_foundation.py checks "
                    "the mounts); pass --all-prefixes to fuzz them too")
                continue
            print(f"fuzzing {op.label} ...", flush=True)
            after = restore_settings if op.path in ("/internal/set", "/v1/params") else (lambda: None)
            try:
                fuzz_operation(op, url, root, figures, args.examples, keep, after)
            except KeyboardInterrupt:
                figures.excluded[f"{op.label} and every operation after it"] = "the run was interrupted"
                break
            if proc.poll() is not None:
                figures.violations[op.label]["server exited"] += 1
                break
        procs.note_children(proc)
        ok = report(figures, started, args, commit)
        if ok:
            procs.stop_all()  # first: a server stopping writes its state files into the folder again
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\nserver log: {root / 'server.log'} (kept)")
        return 0 if ok else 1
    finally:
        procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
