"""Filesystem paths are shown to admins only.

Engine command lines and log lines name files under the user's home, cache and model folders,
which tell a web page or a non-admin key holder who the user is and how the machine is laid out.
Whoever may use `/internal/*` sees them as they are; everyone else sees placeholders (`~`,
`<cache>`, `<models_dir>`, ...), which keep the text readable.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request

from lemonade.api.middleware import Scope, is_admin
from lemonade.services import Services


def path_redactor(svc: Services) -> Callable[[str], str]:
    values = svc.config.values
    given = [(str(svc.cache_dir), "<cache>"), (str(svc.config_dir), "<config>"),
             (values.get("extra_models_dir") or "", "<extra_models_dir>"),
             (values.get("models_dir") if values.get("models_dir") != "auto" else "", "<models_dir>"),
             (sys.prefix, "<python>"), (str(Path.home()), "~")]
    places = sorted(((str(Path(p).expanduser()), name) for p, name in given if p and p != "/"),
                    key=lambda item: -len(item[0]))  # the longest (innermost) folder first

    def redact(text: str) -> str:
        for path, name in places:
            text = text.replace(path, name)
        return text

    return redact


def text_view(scope: Scope, svc: Services) -> Callable[[str], str]:
    """Identity for admins, the path redactor for everyone else."""
    if is_admin(scope, svc.api_key, svc.admin_key):
        return lambda text: text
    return path_redactor(svc)


def entry_view(scope: Scope, svc: Services) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A log entry as this reader may see it."""
    view = text_view(scope, svc)
    return lambda entry: {**entry, "line": view(entry["line"])}


def paths_shown(request: Request, include_paths: bool) -> bool:
    """Whether a local model file is shown by its absolute path: when asked (`include_paths`), and always
    to admins (`serving/models.py` `shown_checkpoint`)."""
    svc: Services = request.app.state.services
    return include_paths or is_admin(request.scope, svc.api_key, svc.admin_key)
