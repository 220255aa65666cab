"""`lemonade import [JSON_FILE]`: register and download a model described by a JSON file
(guide-cli.md, "Options for import").

The file is a `/v1/pull` body, as `lemonade export` writes it: `model_name` (or `id`), `recipe`,
`checkpoint` or `checkpoints`, optional labels, recipe options, image defaults, size, and for a
collection its `components` and embedded `models` (a `collection.router` also its `version` and `routing`
policy). The name gets `user.` when it lacks it; when both
`checkpoint` and `checkpoints` are given only `checkpoints` is used; unrecognised fields are dropped
(and named). Without JSON_FILE the recipes of `lemonade-sdk/recipes` are browsed interactively, or
one is taken non-interactively with `--directory` and `--recipe-file` (`--yes`/`--skip-prompt`).
`LEMONADE_RECIPES_URL` points at another copy of that repository's files (a mirror, a test server).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer
from rich.markup import escape

from lemonade.cli.common import EXIT_USAGE, HostOpt, PortOpt, err, fail, require_server
from lemonade.util.lazy import lazy_module

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")  # imported on first use (util/lazy.py)

RECIPES_REPO = "lemonade-sdk/recipes"
RAW_URL = f"https://raw.githubusercontent.com/{RECIPES_REPO}/main"
LISTING_URL = f"https://api.github.com/repos/{RECIPES_REPO}/contents"
FIELDS = ("model_name", "recipe", "checkpoint", "checkpoints", "labels", "recipe_options", "image_defaults", "size",
          "components", "models", "source", "registry_source", "mmproj", "reasoning", "vision", "embedding",
          "reranking", "version", "routing")


def import_body(raw: Any, where: str) -> tuple[dict[str, Any], list[str]]:
    """The `/v1/pull` body an import file describes, and the fields it dropped. Raises ValueError
    naming the field that is missing or of the wrong type."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must hold a JSON object (a model definition), not {type(raw).__name__}")
    body = dict(raw)
    if "model_name" not in body and "id" in body:
        body["model_name"] = body.pop("id")
    name = body.get("model_name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: 'model_name' (or 'id') is required, a string such as \"MyModel\"")
    if not isinstance(body.get("recipe"), str) or not body["recipe"]:
        raise ValueError(f"{where}: 'recipe' is required, a string such as \"llamacpp\"")
    if "checkpoints" in body:
        if not isinstance(body["checkpoints"], dict):
            raise ValueError(f"{where}: 'checkpoints' must be an object such as {{\"main\": \"org/model:Q4_0\"}}")
        body.pop("checkpoint", None)  # both given: `checkpoints` is the one used
    elif "checkpoint" in body and not isinstance(body["checkpoint"], str):
        raise ValueError(f"{where}: 'checkpoint' must be a string such as \"org/model:Q4_K_M\"")
    elif "checkpoint" not in body and not body["recipe"].startswith("collection."):
        raise ValueError(f"{where}: 'checkpoint' (a string like \"org/model:Q4_K_M\") or 'checkpoints' (an object) "
                         "is required")
    dropped = sorted(k for k in body if k not in FIELDS)
    for key in dropped:
        del body[key]
    name = name.strip()
    body["model_name"] = name if name.startswith("user.") else "user." + name
    return body, dropped


def _raw_base() -> str:
    return os.environ.get("LEMONADE_RECIPES_URL", RAW_URL).rstrip("/")


def _get(url: str, what: str) -> httpx.Response:
    try:
        resp = httpx.get(url, timeout=30, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise fail(f"Cannot fetch {what} from {url}: {exc}. Check the network; on a machine without it, download "
                   "the recipe file elsewhere and run `lemonade import FILE`.") from None
    if resp.status_code == 404:
        raise fail(f"{what} does not exist ({url}). Browse https://github.com/{RECIPES_REPO} for the directories "
                   "and file names.")
    if resp.status_code >= 400:
        raise fail(f"Fetching {what} from {url} failed with HTTP {resp.status_code}.")
    return resp


def fetch_recipe(directory: str, recipe_file: str) -> tuple[Any, str]:
    url = f"{_raw_base()}/{quote(directory.strip('/'))}/{quote(recipe_file)}"
    resp = _get(url, f"Recipe {directory}/{recipe_file}")
    try:
        return resp.json(), url
    except ValueError as exc:
        raise fail(f"{url} is not valid JSON: {exc}") from None


def _listing(path: str) -> list[dict[str, Any]]:
    url = f"{LISTING_URL}/{quote(path)}" if path else LISTING_URL
    items = _get(url, f"The recipe listing{' of ' + path if path else ''}").json()
    return items if isinstance(items, list) else []


def _choose(title: str, names: list[str]) -> str | None:
    """A numbered menu; an empty answer skips (None)."""
    if not names:
        raise fail(f"Nothing to choose from: {title} is empty.")
    err.print(f"[bold]{escape(title)}[/bold]", highlight=False)
    for i, name in enumerate(names, 1):
        err.print(f"  {i}. {escape(name)}", highlight=False)
    while True:
        answer = typer.prompt("Number (empty to skip)", default="", show_default=False, err=True).strip()
        if not answer:
            return None
        if answer.isdigit() and 1 <= int(answer) <= len(names):
            return names[int(answer) - 1]
        err.print(f"Give a number from 1 to {len(names)}, or nothing to skip.")


def _browse(directory: str | None) -> tuple[str, str] | None:
    """Interactive: pick a directory (unless given), then a recipe file; None when skipped."""
    if directory is None:
        dirs = sorted(i["name"] for i in _listing("") if i.get("type") == "dir" and not i["name"].startswith("."))
        directory = _choose(f"Recipe directories of {RECIPES_REPO}", dirs)
        if directory is None:
            return None
    files = sorted(i["name"] for i in _listing(directory) if i.get("type") == "file" and i["name"].endswith(".json"))
    chosen = _choose(f"Recipes in {directory}", files)
    return (directory, chosen) if chosen else None


def import_model(
    file: Annotated[Path | None, typer.Argument(help="A model JSON file (e.g. written by `lemonade export`); omit "
                                                     "it to browse lemonade-sdk/recipes")] = None,
    directory: Annotated[str | None, typer.Option("--directory", help="Remote recipes directory, e.g. "
                                                                       "coding-agents")] = None,
    recipe_file: Annotated[str | None, typer.Option("--recipe-file",
                                                    help="Recipe JSON file name in --directory")] = None,
    skip_prompt: Annotated[bool, typer.Option("--skip-prompt", "--yes", help="Non-interactive (remote import then "
                                              "needs --directory and --recipe-file)")] = False,
    host: HostOpt = None, port: PortOpt = None,
) -> None:
    """Register and download the model(s) described by a JSON file or a remote recipe."""
    from lemonade.cli.models_cmd import run_pull

    if file is not None and (directory or recipe_file):
        raise fail("Give either JSON_FILE or --directory/--recipe-file, not both.", EXIT_USAGE)
    if recipe_file and not directory:
        raise fail("--recipe-file names a file of a remote recipes directory: give --directory too, e.g. "
                   "--directory coding-agents --recipe-file NAME.json.", EXIT_USAGE)
    interactive = not skip_prompt and sys.stdin.isatty()
    if file is None and not (directory and recipe_file) and not interactive:
        raise fail("Without JSON_FILE, a non-interactive import (--yes, --skip-prompt, or no terminal) needs both "
                   "--directory and --recipe-file, e.g. lemonade import --directory coding-agents "
                   "--recipe-file NAME.json --yes.", EXIT_USAGE)
    client = require_server(host, port)
    if file is not None:
        try:
            raw: Any = json.loads(file.read_text())
        except OSError as exc:
            raise fail(f"Cannot read {file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise fail(f"{file} is not valid JSON: {exc}") from None
        where = str(file)
    else:
        if not (directory and recipe_file):
            picked = _browse(directory)
            if picked is None:
                err.print("Skipped: nothing imported.")
                return
            directory, recipe_file = picked
        raw, where = fetch_recipe(directory, recipe_file)
    try:
        body, dropped = import_body(raw, where)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if dropped:
        err.print(f"[dim]Ignoring unrecognized field(s) of {escape(where)}: {escape(', '.join(dropped))}[/dim]",
                  highlight=False)
    if interactive and file is None and not typer.confirm(f"Import {body['model_name']} ({body['recipe']})?",
                                                          default=True, err=True):
        err.print("Skipped: nothing imported.")
        return
    client.timeout = None
    run_pull(client, body)


def register(app: typer.Typer) -> None:
    app.command("import")(import_model)
