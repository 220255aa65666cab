"""Fetching one file into the cache: resumable, interruptible, verified.

The bytes are moved by huggingface_hub's `http_get` (its retries, Range resume and error
mapping) into `blobs/<etag>.incomplete`, which we keep between attempts and across restarts (the
library's own `hf_hub_download` throws partial data away, which would make pause/resume
impossible). Once complete, the file is checked against the size and hash the registry published
(sha256 for LFS and ModelScope files, the git blob sha1 for small files); a mismatch is reported,
the data is thrown away and fetched again. Only then is the blob renamed into place and linked
into the snapshot, so a partial or corrupted file never looks downloaded.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from lemonade.downloads.cache import blob_path, disk_free, link_into_snapshot, partial_path
from lemonade.downloads.hub import RemoteFile, RepoListing, file_location, hf_error

log = logging.getLogger("lemonade.downloads")
VERIFY_ATTEMPTS = 3
# Progress callback: (bytes of this file on disk, file size or None, bytes that were there already).
Report = Callable[[int, int | None, int], None]

_blob_locks: dict[str, threading.Lock] = {}
_blob_locks_guard = threading.Lock()


class Stopped(Exception):
    """The download was asked to stop (pause, cancel, shutdown); partial data is kept."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DiskFull(Exception):
    pass


class IntegrityError(Exception):
    pass


class _ProgressFile:
    """The file object handed to `http_get`: counts bytes and stops the transfer between chunks."""

    def __init__(self, fh: BinaryIO, start: int, total: int | None, previous: int, report: Report,
                 should_stop: Callable[[], str | None]) -> None:
        self._fh = fh
        self.position = start
        self._total = total
        self._previous = previous
        self._report = report
        self._should_stop = should_stop

    def write(self, data: bytes) -> int:
        reason = self._should_stop()
        if reason:
            raise Stopped(reason)
        written = self._fh.write(data)
        self.position += written
        self._report(self.position, self._total, self._previous)
        return written

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        result = self._fh.truncate(size)
        self.position = self._fh.tell() if size is None else size
        return result

    def flush(self) -> None:
        self._fh.flush()


def _lock_for(path: Path) -> threading.Lock:
    with _blob_locks_guard:
        return _blob_locks.setdefault(str(path), threading.Lock())


def _hash_matches(path: Path, remote: RemoteFile) -> tuple[bool, str]:
    """(ok, what was found) for the strongest check the registry allows."""
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        return False, f"size {size} bytes instead of {remote.size}"
    if remote.sha256:
        digest = hashlib.sha256()
        expected, kind = remote.sha256.lower(), "sha256"
    elif remote.git_sha1 and len(remote.git_sha1) == 40:
        digest = hashlib.sha1(b"blob %d\0" % size)
        expected, kind = remote.git_sha1.lower(), "git sha1"
    else:
        return True, "size only"
    with open(path, "rb") as fh:
        while block := fh.read(4 * 1024 * 1024):
            digest.update(block)
    got = digest.hexdigest()
    return got == expected, f"{kind} {got} instead of {expected}"


def fetch_file(folder: Path, listing: RepoListing, remote: RemoteFile, report: Report,
               should_stop: Callable[[], str | None]) -> int:
    """Make `snapshots/<commit>/<path>` exist and be verified; returns the bytes fetched over the network."""
    blob = blob_path(folder, remote.etag)
    lock = _lock_for(blob)
    while not lock.acquire(timeout=0.25):  # another pull is fetching the same blob right now
        reason = should_stop()
        if reason:
            raise Stopped(reason)
    try:
        if blob.exists() and _still_intact(blob, listing, remote):
            link_into_snapshot(folder, listing.commit, remote.path, remote.etag)
            size = blob.stat().st_size
            report(size, size, size)
            return 0
        return _download_verified(folder, listing, remote, report, should_stop)
    finally:
        lock.release()


def _still_intact(blob: Path, listing: RepoListing, remote: RemoteFile) -> bool:
    """A file already in the cache is checked again on every pull (size, then hash): bytes that rotted
    or were cut short since it was fetched are deleted, so the pull fetches the file anew."""
    ok, found = _hash_matches(blob, remote)
    if not ok:
        log.error("The cached copy of %s of %s is damaged (%s); it is deleted and downloaded again",
                  remote.path, listing.repo, found)
        blob.unlink()
    return ok


def _download_verified(folder: Path, listing: RepoListing, remote: RemoteFile, report: Report,
                       should_stop: Callable[[], str | None]) -> int:
    from huggingface_hub.file_download import http_get

    partial = partial_path(folder, remote.etag)
    partial.parent.mkdir(parents=True, exist_ok=True)
    fetched = 0
    for attempt in range(1, VERIFY_ATTEMPTS + 1):
        url, headers, size = file_location(listing, remote)
        expected = remote.size if remote.size is not None else size
        have = partial.stat().st_size if partial.exists() else 0
        if expected is not None and have > expected:
            log.warning("Partial download of %s is larger than the file (%d > %d bytes); starting over",
                        remote.path, have, expected)
            partial.unlink()
            have = 0
        if expected is not None:
            free = disk_free(partial.parent)
            if free is not None and free < expected - have:
                raise DiskFull(_disk_message(partial.parent, remote.path, expected - have, free))
        report(have, expected, have)
        try:
            with open(partial, "ab") as fh:
                sink = _ProgressFile(fh, have, expected, have, report, should_stop)
                http_get(url, sink, resume_size=have, headers=headers, expected_size=expected,  # type: ignore[arg-type]
                         displayed_filename=remote.path)
                fetched += sink.position - have
        except Stopped:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted out below
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise DiskFull(_disk_message(partial.parent, remote.path, (expected or 0) - have,
                                             disk_free(partial.parent))) from None
            if type(exc) is OSError and "Consistency check failed" in str(exc):
                # http_get got fewer or more bytes than announced: the checks below decide what to keep
                log.warning("Download of %s from %s did not complete: %s", remote.path, listing.repo, exc)
            elif isinstance(exc, (FileNotFoundError, PermissionError)):
                raise
            else:  # registry and transport errors (huggingface_hub's HTTP errors are OSErrors too)
                raise hf_error(exc, f"Downloading '{remote.path}' of {listing.repo}") from None
        ok, found = _hash_matches(partial, remote)
        if ok:
            os.replace(partial, blob_path(folder, remote.etag))
            link_into_snapshot(folder, listing.commit, remote.path, remote.etag)
            return fetched
        log.error("Integrity check failed for %s of %s: got %s (attempt %d of %d); the corrupted data "
                  "was deleted and the file is downloaded again", remote.path, listing.repo, found, attempt,
                  VERIFY_ATTEMPTS)
        partial.unlink()
    raise IntegrityError(f"'{remote.path}' of {listing.repo} failed its integrity check {VERIFY_ATTEMPTS} times "
                         "(the registry's data does not match the hash it publishes); nothing was kept")


def _disk_message(where: Path, name: str, needed: int, free: int | None) -> str:
    free_text = f"{free / 1e6:.1f} MB free" if free is not None else "free space unknown"
    return (f"Not enough disk space in {where} to download '{name}': {needed / 1e6:.1f} MB more needed, "
            f"{free_text}. Free some space (or set models_dir to a larger disk) and pull again; the "
            "partial download is kept and resumes where it stopped.")
