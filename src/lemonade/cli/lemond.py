"""`lemond`: the server executable under the name and arguments Lemonade gives it
(guide-configuration-README.md, "lemond CLI"):

    lemond [cache_dir] [config_dir] [--port PORT] [--host HOST] [--broadcast | --no-broadcast]

Scripts, service units and Lemonade's own tests start the server this way; `lemonade serve` is the
same server with more options. As in Lemonade, a cache dir given without a config dir keeps the
persistent JSON there too (a portable install), and `--port`/`--host`/`--broadcast` override
config.json for this process only. argparse rather than typer: a service starts faster without it.
"""

from __future__ import annotations

import argparse
import os
import sys

from lemonade import __version__


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lemond", description="lemond - Lemonade's local AI server")
    p.add_argument("cache_dir", nargs="?",
                   help="Lemonade cache directory for downloaded/runtime data (default: the platform's)")
    p.add_argument("config_dir", nargs="?",
                   help="Lemonade config directory for persistent JSON state (default: cache_dir when that is "
                        "given, else the platform's)")
    p.add_argument("--port", type=int, help="Port number to serve on (runtime override)")
    p.add_argument("--host", help="Address to bind for connections (runtime override)")
    p.add_argument("--broadcast", action=argparse.BooleanOptionalAction, default=None,
                   help="Enable or disable UDP broadcasting for server discovery")
    p.add_argument("-v", "--version", action="version", version=f"lemond version {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cache_dir:
        os.environ["LEMONADE_CACHE_DIR"] = os.path.abspath(args.cache_dir)
        os.environ["LEMONADE_CONFIG_DIR"] = os.path.abspath(args.config_dir or args.cache_dir)
    overrides = {key: value for key, value in (("port", args.port), ("host", args.host),
                                                ("broadcast", args.broadcast)) if value is not None}
    from lemonade.config import ConfigError, validate_tree
    from lemonade.server import serve

    try:
        validate_tree(overrides)
    except ConfigError as exc:
        print(f"lemond: error: {exc}", file=sys.stderr)
        return 2
    return serve(overrides)


if __name__ == "__main__":
    sys.exit(main())
