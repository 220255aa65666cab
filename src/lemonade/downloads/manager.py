"""The download manager: one shared download per model, server-owned jobs, deletes, update checks.

- `pull_events(model)` is the one way files get onto disk. Every caller that wants a model while
  it is downloading (a `/v1/pull`, an inference request, a job) subscribes to the same `Transfer`,
  so two pulls of one model share one download. The transfer runs in a daemon thread (network
  and disk I/O block) and reports progress to the event loop.
- A transfer nobody waits for any more (a client hung up on an SSE pull) stops, keeping its
  partial file; a server-owned job keeps its transfer alive until paused or cancelled.
- Offline mode (config `offline`, LEMONADE_OFFLINE=1, HF_HUB_OFFLINE=1) is checked before any
  network call and every refusal says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from lemonade.checkpoints.local import PENDING_DIR, list_snapshot_files, pending_files, repo_folder, snapshot_dirs
from lemonade.checkpoints.variants import match_variant, parse_checkpoint
from lemonade.downloads import cache as cache_ops
from lemonade.downloads.hub import HubError
from lemonade.downloads.jobs import Job, JobStore, job_id
from lemonade.downloads.plan import plan_model
from lemonade.downloads.transfer import DiskFull, IntegrityError, Stopped, fetch_file
from lemonade.downloads.updates import find_updates
from lemonade.errors import APIError
from lemonade.model_info import ModelInfo
from lemonade.runtime.request_context import load_progress


class ModelFiles(Protocol):
    """What the download manager needs of the catalog (the catalog satisfies it; typed here so that
    `downloads/` does not import `catalog/`)."""

    def hub_cache(self) -> Path: ...
    def find(self, name: str) -> ModelInfo | None: ...
    def local_files(self, model: ModelInfo) -> dict[str, list[Path]] | None: ...
    def is_downloaded(self, model: ModelInfo) -> bool: ...
    def all(self, rescan: bool = True) -> list[ModelInfo]: ...
    def collection_file(self, model: ModelInfo) -> ModelInfo | None: ...
    def pointer_file(self, model: ModelInfo) -> ModelInfo | None: ...
    def adopt_collection_file(self, model: ModelInfo, register: bool = True) -> bool: ...


log = logging.getLogger("lemonade.downloads")
EMIT_INTERVAL = 0.2        # seconds between progress events of one transfer
CHUNK_SIZE = 1024 * 1024   # huggingface_hub reads 10 MiB per chunk by default: too coarse to pause promptly
HUB_CODES = {400: "lemond_offline", 403: "gated_repo", 404: "checkpoint_not_found", 429: "rate_limited",
             502: "upstream_error"}


def offline_error(what: str) -> APIError:
    return APIError(400, f"Lemonade is in offline mode (offline=true in config, LEMONADE_OFFLINE=1 or "
                         f"HF_HUB_OFFLINE=1) and never contacts Hugging Face or ModelScope, so it cannot {what}. "
                         "Turn offline mode off (lemonade config set offline=false) to use the network.",
                    code="lemond_offline")


Installer = Callable[[Callable[[dict[str, Any]], None]], object]  # an engine's install, given its progress callback


class DownloadStopped(APIError):
    """Raised to everyone waiting on a download that was paused, cancelled or abandoned."""

    def __init__(self, model_name: str, reason: str) -> None:
        verb = {"pause": "paused", "cancel": "cancelled", "shutdown": "stopped because the server is shutting "
                "down", "abandoned": "stopped because nobody is waiting for it any more"}.get(reason, reason)
        super().__init__(409, f"Download of {model_name} was {verb}; pull it again to resume from where it stopped",
                         code=f"download_{'paused' if reason == 'pause' else 'cancelled'}")
        self.reason = reason


def hub_api_error(exc: HubError) -> APIError:
    extra = {"upstream_status": exc.upstream_status} if exc.upstream_status and exc.status >= 500 else None
    return APIError(exc.status, exc.message, code=HUB_CODES.get(exc.status), extra=extra)


class Transfer:
    """One running download of one model, shared by every caller that wants that model."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.loop = loop
        self.progress: dict[str, Any] = {}
        self.queues: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self.owners = 0
        self.stop_event = threading.Event()
        self.stop_reason: str | None = None
        self.done: asyncio.Future[APIError | None] = loop.create_future()
        self._last_emit = 0.0
        self._last_key: tuple[Any, ...] = ()
        self._held = False

    # ----- worker thread side --------------------------------------------------------------------
    def should_stop(self) -> str | None:
        return self.stop_reason if self.stop_event.is_set() else None

    def report(self, progress: dict[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self._publish, progress)

    # ----- event loop side -----------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if not self.stop_event.is_set():
            self.stop_reason = reason
            self.stop_event.set()

    def _publish(self, progress: dict[str, Any]) -> None:
        self.progress = progress
        now = time.monotonic()
        key = (progress["file_index"], progress["bytes_downloaded"] >= (progress["bytes_total"] or 0))
        if key == self._last_key and now - self._last_emit < EMIT_INTERVAL:
            self._held = True  # throttled, but never the first or the last event of a file
            return
        self._last_key, self._last_emit, self._held = key, now, False
        for queue in self.queues:
            queue.put_nowait(dict(progress))

    def finish(self, error: APIError | None) -> None:
        if self._held:  # the latest numbers (where a paused download stopped) reach everyone
            for queue in self.queues:
                queue.put_nowait(dict(self.progress))
        for queue in self.queues:
            queue.put_nowait(None)
        if not self.done.done():
            self.done.set_result(error)

    def subscribe(self, owner: bool) -> asyncio.Queue[dict[str, Any] | None]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        if self.progress:
            queue.put_nowait(dict(self.progress))
        if self.done.done():
            queue.put_nowait(None)
        self.queues.add(queue)
        self.owners += owner
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any] | None], owner: bool) -> None:
        self.queues.discard(queue)
        self.owners -= owner
        if not self.queues and self.owners <= 0 and not self.done.done():
            log.info("Nobody waits for the download of %s any more; stopping it (the partial data is kept)",
                     self.name)
            self.stop("abandoned")


class DownloadManager:
    """Server-owned downloads: pulls, jobs that survive restarts, the update check."""

    def __init__(self, cache_dir: Path, catalog: ModelFiles, offline: Callable[[], bool]) -> None:
        self.catalog = catalog
        self._offline = offline
        self.update_check_done = False
        self.updates_available: set[str] = set()
        self.jobs = JobStore(cache_dir)
        self._transfers: dict[str, Transfer] = {}
        self._update_task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self, check_updates: bool) -> None:
        """Server startup: restore download jobs (paused) and start the update check."""
        from huggingface_hub import constants

        constants.DOWNLOAD_CHUNK_SIZE = CHUNK_SIZE
        self.jobs.load()
        for key, job in list(self.jobs.jobs.items()):  # jobs saved under an older id of their model
            model = self.catalog.find(job.model_name)
            if model is not None and model.name != job.model_name:
                del self.jobs.jobs[key]
                job.model_name = model.name
                self.jobs.jobs.setdefault(job.id, job)
        if check_updates and not self._offline():
            self.start_update_check()

    @property
    def cache(self) -> Path:
        return self.catalog.hub_cache()

    # ----- pulling -------------------------------------------------------------------------------
    async def pull_events(self, model: ModelInfo, *, upgrade: bool = True,
                          job: Job | None = None) -> AsyncIterator[dict[str, Any]]:
        """Progress dicts until `model` is on disk (file, file_index, total_files, bytes_downloaded,
        bytes_total, percent, total_download_size, bytes_previously_downloaded, completed_files_bytes,
        cumulative_bytes_downloaded, model); raises APIError when the download fails or is stopped.

        `upgrade=False` returns at once for a model that is already downloaded; otherwise the
        registry is asked for the current files, and only what changed is fetched.
        """
        if model.is_collection:
            # A registry-backed collection: its file names the components (fetched again on an upgrading
            # pull, so the collection follows its file).
            file = self.catalog.collection_file(model) or (self.catalog.pointer_file(model) if upgrade else None)
            if file is not None:
                try:
                    async for event in self.pull_events(file, upgrade=upgrade, job=job):
                        yield event
                except APIError as exc:
                    if self.catalog.local_files(file) is None:
                        raise
                    log.warning("Collection %s: its file could not be fetched again (%s); using the copy pulled "
                                "before. Pull it again once the registry answers to refresh it.", model.public,
                                exc.message)
                try:
                    await asyncio.to_thread(self.catalog.adopt_collection_file, model)
                except ValueError as exc:
                    raise APIError(422, str(exc), code="invalid_collection_file") from None
            for comp_name in model.components or []:
                comp = self.catalog.find(comp_name)
                if comp is None:
                    raise APIError(404, f"Collection {model.public}: component '{comp_name}' is not a known model",
                                   code="model_not_found")
                log.info("Downloading component: %s (collection %s)", comp_name, model.public)
                async for event in self.pull_events(comp, upgrade=upgrade, job=job):
                    yield event
            return
        if model.metadata_only:
            raise APIError(400, f"Model {model.public} has no 'main' checkpoint, so there is nothing to download "
                           "or load. Register it again with one (POST /v1/models/register with 'checkpoint').",
                           code="missing_checkpoint")
        if model.local_files is not None or model.source == "local" or not model.checkpoints:
            # files that live on disk already (extra models dir, Lemonade's local imports; a cloud model)
            missing = [str(f) for fs in (model.local_files or {}).values() for f in fs if not f.exists()]
            if missing:
                raise APIError(404, f"{model.public} is made of files on this machine, and {missing[0]} is not "
                               "there: it cannot be downloaded. Put the file back, or delete the model.",
                               code="model_files_missing")
            return
        if job is not None:
            job.current_model = model.name
            if job.requested:
                raise DownloadStopped(model.name, job.requested)
        downloaded = self.catalog.local_files(model) is not None
        if downloaded and not upgrade:
            return
        if self._offline():
            if downloaded:
                return
            raise offline_error(f"download {model.public}")
        transfer = await self._transfer(model)
        queue = transfer.subscribe(owner=job is not None)
        try:
            if job is not None and job.requested:
                transfer.stop(job.requested)
            while (update := await queue.get()) is not None:
                yield update
            error = transfer.done.result()
            if error is not None:
                raise error
        finally:
            transfer.unsubscribe(queue, owner=job is not None)

    async def ensure_downloaded(self, model: ModelInfo,
                                progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Pull `model` if it is not on disk yet (inference on a model nobody pulled). `progress` gets
        `{"phase": "download", "message", "percent"}` events (a `/v1/load` stream shows them)."""
        if self.catalog.is_downloaded(model):
            return
        if self._offline():
            raise offline_error(f"download {model.public}, which is not downloaded yet")
        log.info("Model %s is not downloaded; downloading it before loading", model.name)
        async for event in self.pull_events(model, upgrade=False):
            if progress is not None:
                progress({"phase": "download", "message": f"Downloading {model.public}: {event.get('file', '')}",
                          "percent": event.get("percent")})

    async def ready_collection(self, model: ModelInfo) -> None:
        """A registry-backed collection (catalog/collection_file.py) names its components only once its
        file is pulled: on first use, pull it (file and components), as a load of any model downloads it."""
        if self.catalog.collection_file(model) is not None:
            await self.ensure_downloaded(model)

    async def files_for_load(self, model: ModelInfo) -> dict[str, list[Path]]:
        """The files of a model about to load (the router asks), downloaded first when needed; the
        download's progress goes to the load's own (`load_progress`: a `/v1/load` stream shows it)."""
        files = self.catalog.local_files(model)
        if files is not None:
            return files
        await self.ensure_downloaded(model, load_progress.get())
        files = self.catalog.local_files(model)
        if files is None:
            raise APIError(500, f"Model {model.public} was downloaded but its files are not complete on disk",
                           code="model_load_error")
        return files

    async def _transfer(self, model: ModelInfo) -> Transfer:
        existing = self._transfers.get(model.name)
        while existing is not None and existing.stop_event.is_set():
            await asyncio.shield(existing.done)  # a stopping download releases its files first
            existing = self._transfers.get(model.name)
        if existing is not None:
            return existing
        if self._closing:
            raise APIError(503, "The server is shutting down; pull again once it is back",
                           code="service_unavailable")
        transfer = Transfer(model.name, asyncio.get_running_loop())
        self._transfers[model.name] = transfer
        thread = threading.Thread(target=self._work, args=(transfer, model), name=f"download {model.public}",
                                  daemon=True)
        thread.start()
        return transfer

    def _work(self, transfer: Transfer, model: ModelInfo) -> None:
        error: BaseException | None = None
        try:
            self._download(transfer, model)
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop, never lost
            error = exc
        with contextlib.suppress(RuntimeError):  # loop closed: the process is exiting
            transfer.loop.call_soon_threadsafe(self._finished, transfer, model, error)

    def _download(self, transfer: Transfer, model: ModelInfo) -> None:
        started = time.monotonic()
        plan = plan_model(model, self.cache)
        total_size = sum(pf.size for pf in plan)
        key = cache_ops.pending_key(model.name)
        pending: dict[tuple[Path, str], dict[str, str]] = {}
        for pf in plan:
            if not cache_ops.snapshot_path(pf.folder, pf.listing.commit, pf.remote.path).exists():
                pending.setdefault((pf.folder, pf.listing.commit), {})[pf.remote.path] = pf.remote.etag
        for (folder, commit), etags in pending.items():
            cache_ops.write_pending(folder, commit, key, model.name, etags)
        log.info("Pulling %s: %d file(s), %.1f MB, %d to fetch", model.name, len(plan), total_size / 1e6,
                 sum(len(v) for v in pending.values()))
        completed = 0
        fetched = 0
        for index, pf in enumerate(plan, 1):
            reason = transfer.should_stop()
            if reason:
                raise Stopped(reason)

            def report(done: int, size: int | None, previous: int, pf: Any = pf, index: int = index,
                       completed: int = completed) -> None:
                total = size if size is not None else pf.size
                transfer.report({
                    "model": model.name, "file": pf.remote.path, "file_index": index, "total_files": len(plan),
                    "bytes_downloaded": done, "bytes_total": total,
                    "percent": int(done * 100 / total) if total else 100,
                    "total_download_size": total_size, "bytes_previously_downloaded": previous,
                    "completed_files_bytes": completed, "cumulative_bytes_downloaded": completed + done,
                })

            fetched += fetch_file(pf.folder, pf.listing, pf.remote, report, transfer.should_stop)
            completed += pf.size
            unfetched = pending.get((pf.folder, pf.listing.commit))
            if unfetched is not None and unfetched.pop(pf.remote.path, None) is not None:
                cache_ops.write_pending(pf.folder, pf.listing.commit, key, model.name, unfetched)
        for folder, commit in {(pf.folder, pf.listing.commit) for pf in plan}:
            cache_ops.write_ref(folder, commit)
            cache_ops.clear_pending(folder, key)
        for text in model.file_checkpoints.values():  # an update leaves the previous version behind: drop it
            pf = next(pf for pf in plan if pf.listing.repo == parse_checkpoint(text).repo)
            cache_ops.write_provenance(pf.folder, model.public, pf.listing.commit, model.source, text)
            cache_ops.prune_old_snapshots(self.cache, text, model.source, pf.listing.commit)
        elapsed = time.monotonic() - started
        log.info("Pulled %s: %.1f MB fetched in %.1fs", model.name, fetched / 1e6, elapsed)

    def _finished(self, transfer: Transfer, model: ModelInfo, exc: BaseException | None) -> None:
        if self._transfers.get(model.name) is transfer:
            del self._transfers[model.name]
        error = None if exc is None else self._api_error(model, exc)
        if error is None:
            self.updates_available.discard(model.name)
            job = self.jobs.jobs.get(job_id(model.name))
            if job is not None and not job.running and job.status != "completed":
                job.status, job.complete, job.percent, job.finished_at = "completed", True, 100, time.time()
                self.jobs.save()
        elif not isinstance(error, DownloadStopped):
            log.error("Download of %s failed: %s", model.name, error.message)
        transfer.finish(error)

    @staticmethod
    def _api_error(model: ModelInfo, exc: BaseException) -> APIError:
        if isinstance(exc, Stopped):
            return DownloadStopped(model.name, exc.reason)
        if isinstance(exc, HubError):
            return hub_api_error(exc)
        if isinstance(exc, DiskFull):
            return APIError(507, f"Download of {model.public} failed: {exc}", type="server_error",
                            code="insufficient_storage")
        if isinstance(exc, IntegrityError):
            return APIError(502, f"Download of {model.public} failed: {exc}", code="download_corrupted")
        if isinstance(exc, APIError):
            return exc
        log.exception("Unexpected error while downloading %s", model.name, exc_info=exc)
        return APIError(500, f"Download of {model.public} failed: {exc}", type="server_error", code="download_failed")

    # ----- server-owned jobs ---------------------------------------------------------------------
    def _shown(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """A job as clients see it: under its model's public id (the one `/v1/models` lists), while
        jobs are kept by canonical id, which does not change when another model shadows this one."""
        model = self.catalog.find(snapshot.get("model_name", "")) if snapshot.get("type") == "model" else None
        if model is not None and "id" in snapshot:
            snapshot = {**snapshot, "id": job_id(model.public), "model_name": model.public}
        return snapshot

    def _job_key(self, download_id: str) -> str:
        """The stored key of a job named by any id of its model (`model:NAME`, NAME as clients know it)."""
        if download_id in self.jobs.jobs or not download_id.startswith("model:"):
            return download_id
        model = self.catalog.find(download_id.removeprefix("model:"))
        return job_id(model.name) if model is not None else download_id

    def list_jobs(self) -> list[dict[str, Any]]:
        return [self._shown(job.snapshot()) for job in self.jobs.visible()]

    def start_job(self, model: ModelInfo) -> dict[str, Any]:
        """Start (or resume) the server-owned download of `model`; returns its snapshot at once."""
        current = self.jobs.jobs.get(job_id(model.name))
        if current is not None and current.running and not current.requested:
            return self._shown(current.snapshot())
        job = Job(model.name, status="downloading", running=True)
        self.jobs.jobs[job.id] = job
        job.task = asyncio.create_task(self._run_job(job, model, previous=current))
        self.jobs.save()
        return self._shown(job.snapshot())

    def failed_job(self, name: str, message: str) -> dict[str, Any]:
        """A server-owned download that could not start (an unknown model): Lemonade's app asked for a
        job, so it gets one, in `error` with the reason, listed by /v1/downloads until removed."""
        job = Job(name, status="error", error=message, finished_at=time.time())
        self.jobs.jobs[job.id] = job
        self.jobs.save()
        return job.snapshot()

    def start_backend_job(self, name: str, install: Installer) -> dict[str, Any]:
        """`/v1/install` with `stream: true, subscribe: false`, as Lemonade's app asks it: the install of
        `name` (`recipe:backend`) runs as a server-owned job, listed by `/v1/downloads` as
        `backend:<recipe>:<backend>` so that a reloaded page finds it; pause and cancel stop it at its next
        step. `install(progress)` is the engine's blocking install."""
        current = self.jobs.jobs.get(job_id(name, "backend"))
        if current is not None and current.running:
            return current.snapshot()
        job = Job(name, kind="backend", running=True)
        self.jobs.jobs[job.id] = job
        job.task = asyncio.create_task(self._run_backend_job(job, install))
        self.jobs.save()
        return job.snapshot()

    async def _run_backend_job(self, job: Job, install: Installer) -> None:
        def progress(event: dict[str, Any]) -> None:
            if job.requested:
                raise DownloadStopped(job.model_name, job.requested)
            job.phase, job.message = str(event.get("phase", job.phase)), str(event.get("message", job.message))
            if isinstance(event.get("percent"), (int, float)):
                job.percent = event["percent"]

        try:
            await asyncio.to_thread(install, progress)
            job.status, job.complete, job.percent = "completed", True, 100
            log.info("Backend install job %s completed", job.id)
        except DownloadStopped as exc:
            job.status = "cancelled" if exc.reason == "cancel" else "paused"
        except Exception as exc:  # noqa: BLE001 - a job reports, it never crashes the server
            job.status, job.error = "error", str(exc)
            log.error("Backend install job %s failed: %s", job.id, exc)
        finally:
            job.running, job.requested, job.finished_at = False, None, time.time()
            self.jobs.save()

    async def _run_job(self, job: Job, model: ModelInfo, previous: Job | None) -> None:
        if previous is not None and previous.task is not None and not previous.task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(previous.task)  # the old worker is still unwinding
        try:
            async for event in self.pull_events(model, job=job):
                job.apply(event)
                self.jobs.save(force=False)
            job.status, job.complete, job.percent = "completed", True, 100
            log.info("Download job %s completed", job.id)
        except DownloadStopped as exc:
            job.status = "cancelled" if (job.requested or exc.reason) == "cancel" else "paused"
        except APIError as exc:
            if job.requested:
                job.status = "cancelled" if job.requested == "cancel" else "paused"
            else:
                job.status, job.error = "error", exc.message
        except Exception as exc:  # noqa: BLE001 - a job reports, it never crashes the server
            log.exception("Download job %s failed", job.id)
            job.status, job.error = "error", str(exc)
        finally:
            job.running, job.requested, job.finished_at = False, None, time.time()
            self.jobs.save()

    def _stop_job(self, job: Job, action: str) -> None:
        job.requested = action
        job.status = "paused" if action == "pause" else "cancelled"
        transfer = self._transfers.get(job.current_model or job.model_name)
        if transfer is not None:
            transfer.stop(action)
        self.jobs.save()

    def control(self, download_id: str, action: str) -> dict[str, Any]:
        """`/v1/downloads/control`: pause, cancel or remove a job (see the spec for the semantics)."""
        download_id = self._job_key(download_id)
        job = self.jobs.jobs.get(download_id)
        if action == "remove":
            if job is None:
                return {"status": "ok", "missing": True}
            if job.running:
                self._stop_job(job, "cancel")  # stays listed until its worker has stopped
                return self._shown(job.snapshot())
            del self.jobs.jobs[download_id]
            self.jobs.save()
            return {"status": "ok"}
        if job is None:
            raise APIError(404, f"No download job '{download_id}'. GET /v1/downloads lists the jobs.",
                           code="download_not_found")
        if job.status in ("completed", "error") and not job.running:
            return self._shown(job.snapshot())  # a finished job is left as it is
        if job.running:
            self._stop_job(job, action)
        elif action == "cancel":
            job.status = "cancelled"  # a paused job can still be given up
            self.jobs.save()
        return self._shown(job.snapshot())

    # ----- files ---------------------------------------------------------------------------------
    def known_files(self, model: ModelInfo) -> dict[str, list[Path]]:
        """role -> expected local paths (existing or not), from what is on disk and pending pulls.

        Works offline: a pull records the files it still has to fetch, so an interrupted or
        paused download still lists them. A model never pulled lists no files.
        """
        out: dict[str, list[Path]] = {}
        if model.local_files is not None:
            return dict(model.local_files)
        cache = self.cache
        for role, text in model.file_checkpoints.items():
            try:
                ckpt = parse_checkpoint(text)
            except ValueError:
                continue
            folder = repo_folder(cache, ckpt.repo, model.source)
            pending = pending_files(folder)
            candidates: list[tuple[str, set[str]]] = []
            for commit, names in pending.items():
                snap = folder / "snapshots" / commit
                present = set(list_snapshot_files(snap)) if snap.is_dir() else set()
                candidates.append((commit, names | present))
            for snap in snapshot_dirs(cache, ckpt.repo, model.source):
                candidates.append((snap.name, set(list_snapshot_files(snap))))
            out[role] = []
            for commit, names in candidates:
                chosen = match_variant(sorted(names), ckpt.variant)
                if chosen:
                    out[role] = [folder / "snapshots" / commit / f for f in chosen]
                    break
        return out

    async def delete(self, model: ModelInfo) -> bool:
        """Stop any download of `model` and remove its files (partial ones too); True if anything went."""
        job = self.jobs.jobs.get(job_id(model.name))
        if job is not None and job.running:
            self._stop_job(job, "cancel")
        transfer = self._transfers.get(model.name)
        if transfer is not None:
            transfer.stop("cancel")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(transfer.done), 60)
        if job is not None and job.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(job.task), 30)
        return await asyncio.to_thread(self._remove_files, model)

    def _remove_files(self, model: ModelInfo) -> bool:
        cache = self.cache
        key = cache_ops.pending_key(model.name)
        users = self._other_users(model)
        anything = False
        for text in model.file_checkpoints.values():
            ckpt = parse_checkpoint(text)
            folder = repo_folder(cache, ckpt.repo, model.source)
            if not folder.is_dir():
                continue
            before = self.known_files(model)
            had = any(p.exists() for ps in before.values() for p in ps) or bool(pending_files(folder))
            others = users.get(ckpt.repo, [])
            kept = self._shared_files(ckpt.repo, ckpt.variant, others, model.source)
            freed = cache_ops.remove_checkpoint(cache, text, model.source, key,
                                                keep_variants=[variant for _name, variant in others])
            anything = anything or had or freed > 0
            log.info("Deleted %s files of %s (%.1f MB freed)", text, model.name, freed / 1e6)
            for path, names in sorted(kept.items()):
                log.info("Kept %s of %s: %s still use%s it", path, ckpt.repo, ", ".join(sorted(names)),
                         "" if len(names) > 1 else "s")
        return anything

    def _other_users(self, model: ModelInfo) -> dict[str, list[tuple[str, str | None]]]:
        """repo -> (model name, variant) of every other registered model (built-in, user, a collection's
        component: all are catalog entries) with a checkpoint in one of `model`'s repositories that is
        downloaded or being downloaded (a live transfer, or a pull's pending marker: paused and
        interrupted pulls too). Their files are kept when `model` is deleted.

        A model that is registered but was never pulled holds no file: deleting the last downloaded
        model that uses a file frees it, rather than keeping it for a model that may never load."""
        repos = {parse_checkpoint(t).repo for t in model.checkpoints.values()}
        cache = self.cache
        out: dict[str, list[tuple[str, str | None]]] = {}
        for other in self.catalog.all(rescan=False):
            if (other.name == model.name or other.is_collection or other.local_files is not None
                    or other.source != model.source):
                continue
            uses: list[tuple[str, str | None]] = []
            for text in other.checkpoints.values():
                with contextlib.suppress(ValueError):
                    ckpt = parse_checkpoint(text)
                    if ckpt.repo in repos:
                        uses.append((ckpt.repo, ckpt.variant))
            if uses and self._holds_files(other, cache):
                for repo, variant in uses:
                    out.setdefault(repo, []).append((other.name, variant))
        return out

    def _shared_files(self, repo: str, variant: str | None, others: list[tuple[str, str | None]],
                      source: str) -> dict[str, set[str]]:
        """Files of `repo:variant` on disk that the `others` select too: path -> their model names."""
        out: dict[str, set[str]] = {}
        for snap in snapshot_dirs(self.cache, repo, source):
            names = list_snapshot_files(snap)
            mine = set(match_variant(names, variant))
            for name, other in others:
                for path in mine.intersection(match_variant(names, other)):
                    out.setdefault(path, set()).add(name)
        return out

    def _holds_files(self, model: ModelInfo, cache: Path) -> bool:
        """Whether `model` is downloaded, or a pull of it is under way, paused or interrupted."""
        if model.name in self._transfers or self.catalog.local_files(model) is not None:
            return True
        key = cache_ops.pending_key(model.name)
        for text in model.checkpoints.values():
            with contextlib.suppress(ValueError):
                folder = repo_folder(cache, parse_checkpoint(text).repo, model.source)
                if any((folder / PENDING_DIR).glob(f"*.{key}.json")):
                    return True
        return False

    # ----- updates -------------------------------------------------------------------------------
    async def check_updates(self) -> list[str]:
        """Ask the registries about every downloaded model; returns the names that have updates."""
        if self._offline():
            raise APIError(409, "Lemonade is in offline mode (offline=true in config, LEMONADE_OFFLINE=1 or "
                                "HF_HUB_OFFLINE=1), so it does not contact Hugging Face or ModelScope to check "
                                "for model updates. Turn offline mode off to check.", code="lemond_offline")
        models = [m for m in self.catalog.all(rescan=False)
                  if not m.is_collection and m.local_files is None and m.source in ("huggingface", "modelscope")
                  and m.checkpoints and self.catalog.local_files(m) is not None]
        outdated, _problems = await asyncio.to_thread(find_updates, models, self.cache)
        self.updates_available = outdated
        self.update_check_done = True
        log.info("Update check: %d of %d downloaded model(s) have updates%s", len(outdated), len(models),
                 f" ({', '.join(sorted(outdated))})" if outdated else "")
        return sorted(outdated)

    def start_update_check(self) -> None:
        async def run() -> None:
            try:
                await self.check_updates()
            except Exception as exc:  # noqa: BLE001 - a background check only logs
                log.warning("Startup update check failed: %s", exc)
            finally:
                self.update_check_done = True

        self._update_task = asyncio.create_task(run())

    # ----- lifecycle -----------------------------------------------------------------------------
    async def aclose(self) -> None:
        self._closing = True
        if self._update_task is not None:
            self._update_task.cancel()
        for job in self.jobs.jobs.values():
            if job.running:
                job.requested, job.status = "pause", "paused"
        for transfer in list(self._transfers.values()):
            transfer.stop("shutdown")
        pending = [t.done for t in self._transfers.values()]
        if pending:
            await asyncio.wait(pending, timeout=3)
        self.jobs.save()


