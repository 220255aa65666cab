"""SHA-256 digests of the engine release archives Lemonade may download, checked before unpacking.

A release archive (llama.cpp's, whisper.cpp's, stable-diffusion.cpp's; `native_build.fetch_release`)
is unpacked only when its digest is pinned here and the downloaded bytes match it, as upstream
Lemonade pins one per asset (`checksums` in its backend_versions.json):

- pinned and equal: unpacked;
- pinned and different: refused (InstallError `digest_mismatch`), the archive deleted, nothing
  installed; the message says how to build from source instead;
- not pinned: checked against the digest its publisher states for it instead (GitHub's release API
  gives each asset's `digest`, asked over HTTPS of api.github.com before the download), so a user
  online still gets the official archive, verified; where neither a pin nor a published digest is
  to be had (offline, an older release that states none), it is not downloaded at all and the install
  builds the pinned sources instead, as it does when GitHub is unreachable (the build log says why).

Keys are `<release tag>/<asset>` (both in the URL, so a mirror given by `*_RELEASE_BASE_URL` is
checked against the same pins); values are lowercase hex. Add pins for the assets of a version
bump with `scripts/pin_release_digests.py`, which reads the `digest` GitHub publishes for each asset.

`LEMONADE_RELEASE_DIGESTS=<file.json>` adds pins (same keys and values, "sha256:" prefix allowed)
and overrides built-in ones: for an organisation mirroring its own builds of the pinned versions.

Upstream Lemonade pins no digest for the versions this Lemonade uses (its backend_versions.json at
the time of writing pins only four other engines' assets), and this machine cannot reach GitHub to
read them, so PINNED starts empty: until it is filled, every install builds from source.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

ENV_DIGESTS = "LEMONADE_RELEASE_DIGESTS"
GITHUB_API = "https://api.github.com"
ENV_GITHUB_API = "LEMONADE_GITHUB_API_URL"  # GitHub's API, or a stand-in for it (the tests')
PUBLISHED_TIMEOUT = 10.0
# BEGIN PINS (scripts/pin_release_digests.py rewrites this block)
PINNED: dict[str, str] = {}
# END PINS
_HEX = re.compile(r"[0-9a-f]{64}")


class DigestError(ValueError):
    """The pins file named by $LEMONADE_RELEASE_DIGESTS is unusable; the message says why."""


def asset_key(url: str) -> str:
    """`<tag>/<asset>` of a release download URL (`.../releases/download/<tag>/<asset>`)."""
    parts = [p for p in urlsplit(url).path.split("/") if p]
    return "/".join(parts[-2:])


def _normalise(value: object, where: str) -> str:
    text = str(value).strip().lower().removeprefix("sha256:")
    if not _HEX.fullmatch(text):
        raise DigestError(f"{where}: '{value}' is not a SHA-256 digest (64 hex digits, optionally 'sha256:' first)")
    return text


def pins() -> dict[str, str]:
    """The built-in pins with $LEMONADE_RELEASE_DIGESTS's over them."""
    out = dict(PINNED)
    path = os.environ.get(ENV_DIGESTS)
    if path:
        try:
            extra = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DigestError(f"${ENV_DIGESTS} ({path}) cannot be read as JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise DigestError(f"${ENV_DIGESTS} ({path}) must hold an object of '<tag>/<asset>': digest")
        out.update({str(k): _normalise(v, f"${ENV_DIGESTS} entry '{k}'") for k, v in extra.items()})
    return out


def expected(url: str) -> str | None:
    """The pinned digest of the asset at `url`, None when it has none."""
    return pins().get(asset_key(url))


def is_pinned(url: str) -> bool:
    """Whether an install would use this archive (for messages; a bad pins file counts as no pin)."""
    try:
        return expected(url) is not None
    except DigestError:
        return False


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def api_url() -> str:
    return os.environ.get(ENV_GITHUB_API) or GITHUB_API


def published(publisher: str, url: str, timeout: float = PUBLISHED_TIMEOUT) -> str | None:
    """The SHA-256 digest GitHub states for the asset at `url` (the same tag and file name in the
    release folder `publisher`, `https://github.com/<owner>/<repo>/releases/download`): its release
    API's `digest` field. None when GitHub states none or cannot be asked; the caller then builds
    from source. A mirror's URL is checked against the official asset's digest."""
    import httpx  # a project dependency; imported here so the module loads fast

    parts = [p for p in urlsplit(publisher).path.split("/") if p]
    if len(parts) < 2 or urlsplit(publisher).hostname != "github.com":
        return None
    tag, asset = asset_key(url).split("/", 1) if "/" in asset_key(url) else ("", "")
    api = api_url()
    try:
        resp = httpx.get(f"{api.rstrip('/')}/repos/{parts[0]}/{parts[1]}/releases/tags/{tag}", timeout=timeout,
                         headers={"Accept": "application/vnd.github+json"}, follow_redirects=True)
        release = resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    for item in release.get("assets") or [] if isinstance(release, dict) else []:
        if isinstance(item, dict) and item.get("name") == asset and isinstance(item.get("digest"), str):
            try:
                return _normalise(item["digest"], f"GitHub's digest of {asset}")
            except DigestError:
                return None
    return None
