"""Remote registries: what files a repository holds, and where to fetch each one.

Hugging Face goes through `huggingface_hub` (the real client; `HF_ENDPOINT` points it elsewhere),
ModelScope through its HTTP API (`MODELSCOPE_ENDPOINT`). Both answer with a `RepoListing` so the
rest of the download code does not care which registry a model comes from. Every function here
blocks; callers run them in a worker thread.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import httpx

SOURCES = {"huggingface": "huggingface", "hf": "huggingface", "modelscope": "modelscope", "ms": "modelscope"}
MODELSCOPE_DEFAULT = "https://www.modelscope.cn"
MODELSCOPE_REVISION = "master"
METADATA_TIMEOUT = 30.0


class HubError(Exception):
    """A registry said no (or could not be reached). `status` is what our API answers with."""

    def __init__(self, status: int, message: str, upstream_status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.upstream_status = upstream_status


@dataclass(frozen=True)
class RemoteFile:
    path: str                 # repo-relative, posix
    size: int | None
    etag: str                 # blob name in the cache: sha256 for LFS/ModelScope files, else git blob sha1
    sha256: str | None = None  # when the registry publishes it
    git_sha1: str | None = None  # git blob id of a non-LFS file (its content hash)


@dataclass
class RepoListing:
    source: str
    repo: str
    commit: str
    files: list[RemoteFile] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def get(self, path: str) -> RemoteFile:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)


def canonical_source(value: str | None, default: str = "huggingface") -> str:
    """`huggingface`/`modelscope` from a request value (aliases hf/ms); ValueError names the value."""
    if value is None or value == "":
        return default
    if not isinstance(value, str) or value.strip().lower() not in SOURCES:
        raise ValueError(f"Unsupported model source {value!r}: 'source' must be 'huggingface' or 'modelscope' "
                         "(aliases 'hf', 'ms')")
    return SOURCES[value.strip().lower()]


def split_repo_url(text: str) -> tuple[str, str | None]:
    """`https://huggingface.co/owner/repo[...]` -> ('owner/repo', 'huggingface'); other text unchanged."""
    if not text.startswith(("http://", "https://")):
        return text, None
    parts = urlsplit(text)
    segs = [s for s in parts.path.split("/") if s]
    host = parts.netloc.lower()
    if "modelscope" in host:
        if segs and segs[0] == "models":
            segs = segs[1:]
        return "/".join(segs[:2]), "modelscope"
    if segs and segs[0] == "models":
        segs = segs[1:]
    return "/".join(segs[:2]), "huggingface"


def hf_token() -> str | bool:
    """The `HF_TOKEN` of the server's environment, else no token at all (False)."""
    return os.environ.get("HF_TOKEN") or False


def modelscope_endpoint() -> str:
    return (os.environ.get("MODELSCOPE_ENDPOINT") or MODELSCOPE_DEFAULT).rstrip("/")


def modelscope_headers() -> dict[str, str]:
    token = os.environ.get("MODELSCOPE_API_TOKEN") or os.environ.get("MODELSCOPE_ACCESS_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def hf_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


# ----- listing ---------------------------------------------------------------------------------------

def list_repo(source: str, repo: str) -> RepoListing:
    return _list_modelscope(repo) if source == "modelscope" else _list_huggingface(repo)


def _list_huggingface(repo: str) -> RepoListing:
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo, files_metadata=True, token=hf_token(), timeout=METADATA_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - mapped to an API status below
        raise hf_error(exc, f"Hugging Face repository '{repo}'") from None
    if not info.sha:
        raise HubError(502, f"Hugging Face did not report a commit for '{repo}'")
    files = []
    for sib in info.siblings or []:
        if sib.lfs is not None:
            files.append(RemoteFile(sib.rfilename, sib.lfs.size, sib.lfs.sha256, sha256=sib.lfs.sha256))
        else:
            etag = sib.blob_id or ""
            files.append(RemoteFile(sib.rfilename, sib.size, etag, git_sha1=sib.blob_id))
    return RepoListing("huggingface", repo, info.sha, files)


def hf_error(exc: BaseException, what: str) -> HubError:
    """Map huggingface_hub / transport exceptions to the status our API answers with."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return HubError(403, f"{what} is gated: accept its terms on Hugging Face and set HF_TOKEN for the "
                             "server", 403)
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(404, f"{what} was not found (or is private; set HF_TOKEN for private repositories)", 404)
    if isinstance(exc, RevisionNotFoundError):
        return HubError(404, f"{what}: revision not found", 404)
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(400, f"{what}: huggingface_hub is in offline mode (HF_HUB_OFFLINE)")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 429:
            return HubError(429, f"{what}: Hugging Face rate-limited the request; try again later", 429)
        if status == 404:
            return HubError(404, f"{what}: not found", 404)
        return HubError(502, f"{what}: Hugging Face answered HTTP {status}", status)
    if isinstance(exc, (httpx2.HTTPError, OSError)):
        return HubError(502, f"{what}: cannot reach {hf_endpoint()} ({exc})")
    return HubError(502, f"{what}: {exc}")


def check_modelscope_status(status: int, what: str, not_found: bool = True) -> None:
    """ModelScope's HTTP status as our error: 429 stays 429, a 404 is 404 where it means "no such
    repository" (`not_found`), anything else failing is 502 with the upstream status attached."""
    if status == 404 and not_found:
        raise HubError(404, f"{what}: not found on ModelScope", 404)
    if status == 429:
        raise HubError(429, f"{what}: rate-limited by ModelScope; try again later", 429)
    if status >= 400:
        raise HubError(502, f"{what}: ModelScope answered HTTP {status}", status)


def _ms_get(path: str, params: dict[str, str]) -> dict:
    url = modelscope_endpoint() + path
    try:
        resp = httpx.get(url, params=params, headers=modelscope_headers(), timeout=METADATA_TIMEOUT,
                         follow_redirects=True)
    except httpx.HTTPError as exc:
        raise HubError(502, f"cannot reach ModelScope at {modelscope_endpoint()} ({exc})") from None
    check_modelscope_status(resp.status_code, "ModelScope")
    try:
        body = resp.json()
    except ValueError:
        raise HubError(502, "ModelScope answered with something that is not JSON", resp.status_code) from None
    if not isinstance(body, dict) or body.get("Success") is False:
        message = body.get("Message") if isinstance(body, dict) else None
        raise HubError(404 if "not" in str(message).lower() else 502, f"ModelScope: {message or 'request failed'}")
    return body


def _list_modelscope(repo: str) -> RepoListing:
    try:
        body = _ms_get(f"/api/v1/models/{repo}/repo/files",
                       {"Revision": MODELSCOPE_REVISION, "Recursive": "true"})
    except HubError as exc:
        exc.message = f"ModelScope repository '{repo}': {exc.message}"
        raise
    raw = ((body.get("Data") or {}).get("Files")) or []
    files = []
    for item in raw:
        if not isinstance(item, dict) or item.get("Type") != "blob" or not item.get("Path"):
            continue
        sha = str(item.get("Sha256") or "") or None
        size = item.get("Size")
        etag = sha or hashlib.sha1(f"{item['Path']}:{size}".encode()).hexdigest()
        files.append(RemoteFile(str(item["Path"]), int(size) if isinstance(size, int) else None, etag, sha256=sha))
    files.sort(key=lambda f: f.path)
    # ModelScope branches are names, not commits: a content fingerprint of the tree stands in for the
    # commit so a changed repository gets a new snapshot (and is seen as an update).
    fingerprint = hashlib.sha1("\n".join(f"{f.path}\0{f.etag}\0{f.size}" for f in files).encode()).hexdigest()
    return RepoListing("modelscope", repo, fingerprint, files)


# ----- fetching --------------------------------------------------------------------------------------

def file_location(listing: RepoListing, remote: RemoteFile) -> tuple[str, dict[str, str], int | None]:
    """(url, headers, size) for the GET of one file; Hugging Face resolves CDN redirects first."""
    if listing.source == "modelscope":
        url = (f"{modelscope_endpoint()}/api/v1/models/{listing.repo}/repo?Revision={MODELSCOPE_REVISION}"
               f"&FilePath={quote(remote.path)}")
        return url, modelscope_headers(), remote.size
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(listing.repo, remote.path, revision=listing.commit)
    token = hf_token()
    try:
        meta = get_hf_file_metadata(url, token=token, timeout=METADATA_TIMEOUT)
    except Exception as exc:  # noqa: BLE001
        raise hf_error(exc, f"'{remote.path}' of {listing.repo}") from None
    headers = build_hf_headers(token=token)
    location = meta.location or url
    if urlsplit(location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a signed CDN url must not receive the Hub token
    return location, headers, meta.size if meta.size is not None else remote.size


def read_small_file(listing: RepoListing, path: str, limit: int) -> bytes:
    """The bytes of one small file of the repository (a collection file to inspect), read into memory
    and never written to the cache; a HubError when it is missing, larger than `limit` or unreadable."""
    try:
        remote = listing.get(path)
    except KeyError:
        raise HubError(404, f"'{path}' is not in repository {listing.repo}") from None
    if remote.size is not None and remote.size > limit:
        raise HubError(400, f"'{path}' of {listing.repo} is {remote.size} bytes, too large to be what it is named "
                            f"for (at most {limit})")
    url, headers, _ = file_location(listing, remote)
    try:
        resp = httpx.get(url, headers=headers, timeout=METADATA_TIMEOUT, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise HubError(502, f"cannot fetch '{path}' of {listing.repo} ({exc})") from None
    if resp.status_code != 200:
        raise HubError(502, f"fetching '{path}' of {listing.repo}: the registry answered HTTP {resp.status_code}",
                       resp.status_code)
    if len(resp.content) > limit:
        raise HubError(400, f"'{path}' of {listing.repo} is larger than {limit} bytes")
    return resp.content
