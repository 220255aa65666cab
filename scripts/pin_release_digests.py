#!/usr/bin/env python3
"""Pin the SHA-256 of every release archive of the engine versions this Lemonade uses.

GitHub publishes a `digest` ("sha256:<hex>") for each release asset in its REST API; this reads
those of the pinned llama.cpp, whisper.cpp and stable-diffusion.cpp releases and rewrites the PINS
block of src/lemonade/backends/release_digests.py. Run it after a version bump, on a machine that
reaches api.github.com, and review the diff:

    python scripts/pin_release_digests.py            # rewrite the block
    python scripts/pin_release_digests.py --check    # exit 1 when the block differs from GitHub's digests
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lemonade.backends.llamacpp.build import LLAMA_CPP_VERSION  # noqa: E402
from lemonade.backends.sdcpp.install import SDCPP_VERSION  # noqa: E402
from lemonade.backends.whispercpp.install import WHISPER_CPP_VERSION  # noqa: E402

RELEASES = (("ggml-org/llama.cpp", LLAMA_CPP_VERSION), ("ggml-org/whisper.cpp", WHISPER_CPP_VERSION),
            ("leejet/stable-diffusion.cpp", SDCPP_VERSION))
MODULE = ROOT / "src" / "lemonade" / "backends" / "release_digests.py"
BLOCK = re.compile(r"(# BEGIN PINS[^\n]*\n)(.*?)(# END PINS)", re.DOTALL)


def published_digests() -> dict[str, str]:
    pins: dict[str, str] = {}
    with httpx.Client(timeout=30, headers={"Accept": "application/vnd.github+json"}) as client:
        for repo, tag in RELEASES:
            resp = client.get(f"https://api.github.com/repos/{repo}/releases/tags/{tag}")
            resp.raise_for_status()
            for asset in resp.json().get("assets", []):
                digest = str(asset.get("digest") or "")
                if digest.startswith("sha256:"):
                    pins[f"{tag}/{asset['name']}"] = digest.removeprefix("sha256:")
                else:
                    print(f"warning: {repo} {tag} {asset['name']}: GitHub publishes no digest", file=sys.stderr)
    return pins


def render(pins: dict[str, str]) -> str:
    if not pins:
        return "PINNED: dict[str, str] = {}\n"
    lines = "".join(f'    "{key}":\n        "{value}",\n' for key, value in sorted(pins.items()))
    return "PINNED: dict[str, str] = {\n" + lines + "}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args()
    text = MODULE.read_text()
    match = BLOCK.search(text)
    if match is None:
        print(f"{MODULE}: no '# BEGIN PINS' ... '# END PINS' block", file=sys.stderr)
        return 2
    new_block = render(published_digests())
    if args.check:
        same = match.group(2) == new_block
        print("pins are current" if same else "pins differ from GitHub's digests", file=sys.stderr)
        return 0 if same else 1
    MODULE.write_text(text[:match.start(2)] + new_block + text[match.end(2):])
    print(f"rewrote the pins of {MODULE.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
