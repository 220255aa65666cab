"""`lemonade pull | delete | check-updates | export`: model management commands.

All of them talk to a running server (`ServerClient`). `pull owner/repo` asks the server which
GGUF variants the repository has and offers a menu (or takes `--variant`), then registers the
model as `user.<repo>-<variant>` and downloads it with a progress bar per file and overall; a
repository holding a shared collection (`<RepoName>.json`) is pulled as that collection.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn

from lemonade.catalog.naming import EXTRA, USER, canonical, split
from lemonade.cli.client import ServerClient, console, err_console
from lemonade.cli.common import client as server_client
from lemonade.cli.parsing import RewritingCommand
from lemonade.util.atomic import atomic_write_bytes

MENU_SIZE = 5
EXPORT_DROP = ("id", "created", "object", "owned_by", "downloaded", "suggested", "update_available",
               "max_context_window", "context_length", "checkpoint")


# ----- progress ---------------------------------------------------------------------------------------

class PullProgress:
    """Turns `/v1/pull` SSE events into one bar per file plus an overall bar."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.files: dict[tuple[int, str], TaskID] = {}
        self.overall: TaskID | None = None
        self.current: tuple[int, str] | None = None

    def _finish_current(self) -> None:
        if self.current is not None:
            task = self.progress.tasks[self.files[self.current]]
            self.progress.update(task.id, completed=task.total or task.completed)

    def update(self, event: dict[str, Any]) -> None:
        key = (int(event.get("file_index") or 0), str(event.get("file") or ""))
        total = int(event.get("bytes_total") or 0) or None
        segment = int(event.get("total_download_size") or 0)
        if self.overall is None:
            self.overall = self.progress.add_task("[bold]overall", total=segment or None)
        if key != self.current:
            if self.current is not None and key[0] <= self.current[0]:  # next component of a collection
                overall_total = self.progress.tasks[self.overall].total or 0
                self.progress.update(self.overall, total=overall_total + segment)
            self._finish_current()
            self.current = key
            label = f"[{key[0]}/{event.get('total_files', '?')}] {key[1]}"
            self.files[key] = self.progress.add_task(label, total=total)
        self.progress.update(self.files[key], completed=int(event.get("bytes_downloaded") or 0), total=total)
        self.progress.update(self.overall, completed=sum(self.progress.tasks[t].completed
                                                         for t in self.files.values()))

    def finish(self) -> None:
        self._finish_current()
        if self.overall is not None:
            total = self.progress.tasks[self.overall].total
            self.progress.update(self.overall, completed=total or 0)


def run_pull(client: ServerClient, body: dict[str, Any], to: Console = console) -> None:
    """POST /v1/pull with SSE progress; exits non-zero with the server's message on failure. `to`:
    where progress goes (stderr when stdout carries a command's own output, e.g. `bench --json`)."""
    body = {**body, "stream": True}
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=to, transient=False) as progress:
        bars = PullProgress(progress)
        for event, data in client.sse("/v1/pull", body):
            if event == "progress":
                bars.update(data)
            elif event == "complete":
                bars.finish()
            elif event == "error":
                progress.stop()
                err_console.print(f"[red]Error:[/red] {data.get('error', data)}")
                raise typer.Exit(1)
    to.print(f"[green]Installed model:[/green] {body.get('model_name')}")


# ----- pull -------------------------------------------------------------------------------------------

def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{size} B"


def _choose_variant(variants: list[dict[str, Any]]) -> tuple[str, bool]:
    """Interactive menu: a number picks a listed variant, free text names any other quant."""
    if not sys.stdin.isatty():
        err_console.print("[red]Error:[/red] several variants are available; pass --variant NAME (or run "
                          "interactively). Available: " + ", ".join(v["name"] for v in variants))
        raise typer.Exit(2)
    console.print("Select a variant:")
    shown = variants[:MENU_SIZE]
    for i, v in enumerate(shown, 1):
        count = len(v.get("files") or [])
        console.print(f"  {i}) {v['name']}  ({count} file{'s' if count != 1 else ''}, {_human(v['size_bytes'])})")
    console.print(f"  {len(shown) + 1}) Other (type a variant name)")
    answer = typer.prompt("Enter a number, or type any variant name").strip()
    if answer.isdigit():
        index = int(answer)
        if 1 <= index <= len(shown):
            return shown[index - 1]["name"], True
        if index == len(shown) + 1:
            return typer.prompt("Variant name").strip(), True
        err_console.print("[red]Error:[/red] selection out of range")
        raise typer.Exit(2)
    if not answer:
        raise typer.Exit(2)
    return answer, True


def _repo_pull_body(client: ServerClient, repo: str, variant: str | None, name: str | None, source: str | None,
                    assume_yes: bool) -> dict[str, Any]:
    query = f"/v1/pull/variants?checkpoint={quote(repo)}" + (f"&source={quote(source)}" if source else "")
    info = client.get(query)
    if info.get("repo_kind") == "collection":
        return _collection_pull_body(info, repo, variant, name, source)
    variants = info.get("variants") or []
    prompted = False
    if variant is None:
        if not variants:
            err_console.print(f"[red]Error:[/red] no GGUF variants found in {repo}")
            raise typer.Exit(1)
        if len(variants) == 1 or assume_yes:
            variant = variants[0]["name"]
        else:
            variant, prompted = _choose_variant(variants)
    else:
        for v in variants:  # accept any case, send the repository's spelling
            if v["name"].lower() == variant.lower():
                variant = v["name"]
    default_name = f"user.{info.get('suggested_name') or repo.split('/')[-1]}-{variant}"
    if name is None and prompted:
        name = typer.prompt("Model name", default=default_name).strip()
    model_name = name or default_name
    if not model_name.startswith("user."):
        model_name = "user." + model_name
    body: dict[str, Any] = {"model_name": model_name, "checkpoint": f"{repo}:{variant}",
                            "recipe": info.get("recipe") or "llamacpp"}
    if info.get("suggested_labels"):
        body["labels"] = info["suggested_labels"]
    if info.get("mmproj_files"):
        body["mmproj"] = info["mmproj_files"][0]
    drafts = info.get("draft_files") or []
    if len(drafts) == 1:  # a draft model beside the main one (dflash-*, mtp-*): its `draft` checkpoint
        body["checkpoints"] = {"draft": f"{repo}:{drafts[0]}"}
    elif drafts:
        err_console.print(f"[yellow]Warning:[/yellow] several draft models found beside it ({', '.join(drafts)}); "
                          "none is selected automatically. Name one with --checkpoint main REPO:VARIANT "
                          "--checkpoint draft REPO:FILE.")
    if source:
        body["source"] = source
    console.print(f"Pulling {body['checkpoint']} as {model_name}")
    return body


def _collection_pull_body(info: dict[str, Any], repo: str, variant: str | None, name: str | None,
                          source: str | None) -> dict[str, Any]:
    """A shared collection's repository (`<RepoName>.json` in it): the pull registers the collection
    as a pointer to the repository, and the server fetches that file, then every component it lists
    (custom-models.md, "Share a collection"); a later `lemonade pull NAME` follows the file again."""
    if variant:
        err_console.print(f"[yellow]Warning:[/yellow] --variant {variant} is ignored: {repo} is a collection")
    model_name = name or info.get("suggested_name") or repo.split("/")[-1]
    if not model_name.startswith("user."):
        model_name = "user." + model_name
    body: dict[str, Any] = {"model_name": model_name, "recipe": info.get("recipe") or "collection.omni",
                            "checkpoints": {"main": repo}, "source": source or info.get("source") or "huggingface"}
    count = int(info.get("component_count") or 0)
    size = f", ~{info['size']} GB" if isinstance(info.get("size"), (int, float)) else ""
    console.print(f"Pulling collection {repo} as {model_name} ({count} component{'s' if count != 1 else ''}"
                  f"{size})", highlight=False)
    return body


# Labels a registered model may carry: guide-cli.md's list, the deployment-mode labels (labels.py) and
# those of the built-in catalog. Anything else is most likely a typo, refused before anything is sent.
LABELS = ("coding", "dflash", "hot", "mtp", "reasoning", "tool-calling", "vision", "edit", "upscaling",
          "realtime-transcription", "custom", "systemone")


def known_labels() -> list[str]:
    from lemonade.labels import MODE_ALIASES

    return sorted(set(LABELS) | set(MODE_ALIASES))


def usage_error(message: str) -> typer.Exit:
    err_console.print(f"[red]Error:[/red] {message}\nRun with --help for more information.", highlight=False)
    return typer.Exit(2)


def registration_body(model: str, checkpoint: list[str] | None, recipe: str | None, label: list[str] | None,
                      mmproj: str | None, components: list[str] | None, source: str | None) -> dict[str, Any]:
    """The `/v1/pull` body that registers `user.<model>` (guide-cli.md, "Options for pull"); usage
    errors end the command before anything is sent."""
    unknown = [x for x in label or [] if x not in known_labels()]
    if unknown:
        raise usage_error(f"--label: '{unknown[0]}' is not a label. Valid: {', '.join(known_labels())}.")
    recipe = recipe or ("collection.omni" if components else "llamacpp")
    if recipe == "collection.omni" and not components:
        raise usage_error("--recipe collection.omni bundles models: name them with --components MODEL [MODEL ...].")
    if components and recipe != "collection.omni":
        raise usage_error(f"--components makes an omni collection (--recipe collection.omni), not a {recipe} model.")
    body: dict[str, Any] = {"model_name": model if model.startswith("user.") else f"user.{model}", "recipe": recipe}
    checkpoints: dict[str, str] = {}
    for item in checkpoint or []:
        role, sep, value = item.partition("=")
        if sep and "/" not in role:
            checkpoints[role] = value
        else:
            checkpoints["main"] = item
    if checkpoints:
        body["checkpoints"] = checkpoints
    for key, given in (("labels", label), ("mmproj", mmproj), ("components", components), ("source", source)):
        if given:
            body[key] = given
    return body


class PullCommand(RewritingCommand):
    """`--checkpoint ROLE VALUE` and `--components A B ...`, as the guide writes them."""

    greedy = {"--components": "--component"}
    pairs = ("--checkpoint",)


def register(app: typer.Typer) -> None:
    @app.command(cls=PullCommand)
    def pull(
        model: str = typer.Argument(..., help="Registered model name, or owner/repo[:VARIANT] Hugging Face or "
                                              "ModelScope checkpoint (or its URL)"),
        variant: str | None = typer.Option(None, "--variant", help="GGUF variant to install (skips the menu)"),
        name: str | None = typer.Option(None, "--name", help="Name to register a repository under (user.*)"),
        source: str | None = typer.Option(None, "--source", help="huggingface or modelscope (default: the server's "
                                                                 "default_model_source)"),
        alias: str | None = typer.Option(None, "--alias", help="Add an alias for the model being registered or "
                                                               "pulled"),
        checkpoint: list[str] | None = typer.Option(None, "--checkpoint", metavar="TYPE CHECKPOINT",
                                                    help="Manual registration: a checkpoint entry, e.g. --checkpoint "
                                                         "main org/model:Q4_K_M; repeat for main + mmproj or main + "
                                                         "vae (a lone CHECKPOINT is the main one)"),
        recipe: str | None = typer.Option(None, "--recipe", help="Manual registration: the recipe of the new user.* "
                                                                 "model (llamacpp, whispercpp, sd-cpp, kokoro, "
                                                                 "collection.omni, ...)"),
        label: list[str] | None = typer.Option(None, "--label", help="Manual registration: a label of the new "
                                                                     "model; repeatable (coding, dflash, embeddings, "
                                                                     "hot, mtp, reasoning, reranking, "
                                                                     "tool-calling, vision, ...)"),
        mmproj: str | None = typer.Option(None, "--mmproj", help="mmproj file of a vision model"),
        components: list[str] | None = typer.Option(None, "--components", "--component", metavar="MODEL [MODEL ...]",
                                                    help="Omni-model registration: the component models to bundle "
                                                         "(with --recipe collection.omni); missing ones are pulled "
                                                         "too"),
        yes: bool = typer.Option(False, "--yes", "-y", help="No questions: take the first variant"),
        host: str | None = typer.Option(None, help="Server host"),
        port: int | None = typer.Option(None, help="Server port"),
    ) -> None:
        """Download a model: a registered one, a Hugging Face or ModelScope checkpoint, or a user.* model
        registered with --checkpoint/--recipe (or --components)."""
        from lemonade.downloads.hub import split_repo_url

        target, url_source = split_repo_url(model)
        source = source or url_source
        if checkpoint or recipe or components or label:
            body = registration_body(model, checkpoint, recipe, label, mmproj, components, source)
            client = server_client(host, port, timeout=None)
        else:
            client = server_client(host, port, timeout=None)
            if "/" in target:
                repo, _, inline_variant = target.partition(":")
                body = _repo_pull_body(client, repo, variant or inline_variant or None, name, source, yes)
            else:
                body = {"model_name": target}
        run_pull(client, body)
        if alias:
            result = client.post("/internal/aliases", {"alias": alias, "target": body["model_name"]}) or {}
            console.print(f"Alias [bold]{alias}[/bold] -> {result.get('target', body['model_name'])}",
                          highlight=False)

    @app.command()
    def delete(
        model: str = typer.Argument(..., help="Model to delete from disk"),
        host: str | None = typer.Option(None, help="Server host"),
        port: int | None = typer.Option(None, help="Server port"),
    ) -> None:
        """Delete a model's files (a collection: only its entry; components stay)."""
        client = server_client(host, port)
        result = client.post("/v1/delete", {"model_name": model})
        console.print(result.get("message", f"Deleted model: {model}"))

    @app.command("check-updates")
    def check_updates(
        host: str | None = typer.Option(None, help="Server host"),
        port: int | None = typer.Option(None, help="Server port"),
    ) -> None:
        """Ask the registries whether downloaded models have newer versions."""
        client = server_client(host, port, timeout=None)
        result = client.post("/v1/models/check-updates")
        models = result.get("models") or []
        if not models:
            console.print("All downloaded models are up to date.")
            return
        console.print(f"{len(models)} model(s) have updates (run `lemonade pull NAME` to update):")
        for name in models:
            console.print(f"  {name}")

    @app.command("export")
    def export_model(
        model: str = typer.Argument(..., help="Model or collection to export"),
        output: str | None = typer.Option(None, "--output", "-o", help="Output file path; without it (or with '-') "
                                                                      "the JSON goes to stdout"),
        host: str | None = typer.Option(None, help="Server host"),
        port: int | None = typer.Option(None, help="Server port"),
    ) -> None:
        """Export a model's information as import-ready JSON (collections embed their components)."""
        client = server_client(host, port)
        body = export_body(client, model)
        text = json.dumps(body, indent=2) + "\n"
        if output in (None, "-"):
            sys.stdout.write(text)
            return
        path = Path(output)
        try:
            atomic_write_bytes(path, text.encode())
        except OSError as exc:
            err_console.print(f"[red]Error:[/red] cannot write {path}: {exc.strerror or exc}")
            raise typer.Exit(1) from None
        console.print(f"Exported {body['model_name']} to {path}", highlight=False)


# ----- export -----------------------------------------------------------------------------------------

def _normalise(obj: dict[str, Any], options: dict[str, Any] | None) -> dict[str, Any]:
    """A /v1/models/{id} object as a /v1/pull body: no runtime fields, checkpoints as a dict."""
    body: dict[str, Any] = {"model_name": obj["id"], "recipe": obj["recipe"]}
    checkpoints = obj.get("checkpoints") or ({"main": obj["checkpoint"]} if obj.get("checkpoint") else None)
    if checkpoints:
        body["checkpoints"] = dict(checkpoints)
    for key, value in obj.items():
        if key in EXPORT_DROP or key in body or key in ("checkpoints", "models", "recipe_options"):
            continue
        body[key] = value
    body["recipe_options"] = dict(options or {})
    return body


def export_body(client: ServerClient, model: str) -> dict[str, Any]:
    obj = client.get(f"/v1/models/{quote(model, safe='')}")
    if split(str(obj.get("id", "")))[0] == EXTRA or obj.get("source") == "local":
        err_console.print(f"[red]Error:[/red] {obj['id']} is a file of the extra models dir; copy the file "
                          "instead of exporting it")
        raise typer.Exit(1)
    body = _normalise(obj, obj.get("recipe_options"))
    # Imported, it is registered as a `user.` model, whatever id it is listed under here.
    body["model_name"] = canonical(USER, split(body["model_name"])[1])
    if obj.get("models"):
        embedded = []
        for comp in obj["models"]:
            saved = client.get(f"/v1/models/{quote(comp['id'], safe='')}/options").get("saved") \
                if not comp.get("components") else {}
            entry = _normalise(comp, saved)
            # named as the collection's `components` list names it (the listing may show a bare id)
            entry["model_name"] = next((n for n in obj.get("components") or [] if split(n)[1] == split(comp["id"])[1]),
                                       comp["id"])
            embedded.append(entry)
        body["models"] = embedded
    return body
