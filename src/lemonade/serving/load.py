"""Loading a model: on purpose, the work behind `/v1/load` (also the job op `load`), and for an
inference request that carries load-level options (`load_for_request`).

`prepare_load` does every check first (the name, the options), so bad input is a plain 4xx before
an SSE stream starts, and returns the work that performs the load for the caller to await or to
stream progress around. A `collection.router` model loads nothing (each request loads the member its
policy picks, as in Lemonade); a collection loads its components; any other model is loaded again
when it runs with other options than asked (`Router.ensure_loaded`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from lemonade.errors import bad_request
from lemonade.labels import ROUTER_RECIPE
from lemonade.model_info import ModelInfo
from lemonade.runtime.options import OptionsError, options_for
from lemonade.runtime.router import LoadedModel
from lemonade.services import Services
from lemonade.serving.models import resolve, shown_checkpoint

NAME_KEYS = ("model_name", "model")  # the alias not taken as the name is no option either


def prepare_load(svc: Services, name: str, options: dict[str, Any], *, pinned: bool | None = None,
                 save_options: bool = False, show_paths: bool = False) -> Callable[[], Awaitable[dict[str, Any]]]:
    """Resolve the model, check its `options` (a load request's recipe options, as sent) and return the
    work that performs the load. `pinned`: None keeps the saved pin; `save_options`: store the options
    as the model's own once loaded. `show_paths`: an extra-dir model's checkpoint by absolute path
    (admins), else by file name (/v1/models' rule)."""
    model = resolve(svc, name)
    done = {"status": "success", "message": f"Loaded model: {model.public}", "model_name": model.public,
            "recipe": model.recipe}
    if model.recipe == ROUTER_RECIPE:
        # Virtual, as in Lemonade: each request loads the member its policy picks. Loading every
        # candidate up front would only push other models out.
        async def acknowledge() -> dict[str, Any]:
            return done

        return acknowledge
    if model.is_collection:
        components = [resolve(svc, comp) for comp in model.components or []]

        async def load_collection() -> dict[str, Any]:
            if svc.catalog.collection_file(model) is not None:  # its file names the components
                await svc.downloads.ready_collection(model)
                components.extend(resolve(svc, comp) for comp in model.components or [])
            for comp in components:
                def resolved(c: ModelInfo = comp) -> dict[str, Any]:
                    return svc.options.resolve(c.name, c.recipe)

                await svc.router.ensure_loaded(comp, resolved, pinned=pinned)
            return done

        return load_collection
    try:
        requested = svc.options.parse_request(model.recipe, options, ignore=NAME_KEYS)
    except OptionsError as exc:
        raise bad_request(str(exc)) from None
    effective = svc.options.resolve(model.name, model.recipe, request=requested)
    given_pin = pinned
    if pinned is None:
        pinned = svc.options.saved(model.name).get("pinned")

    if model.checkpoint:
        done["checkpoint"] = shown_checkpoint(model, show_paths)

    async def load_model() -> dict[str, Any]:
        lm = await svc.router.ensure_loaded(model, effective, pinned=pinned)  # loaded again if its options changed
        if save_options:
            svc.options.save_from_load(model.name, requested, given_pin)
        return {**done, **context_fields(lm)}

    return load_model


async def load_for_request(svc: Services, model: ModelInfo, request: dict[str, Any]) -> None:
    """Load `model` for an inference request that carries load-level options (`ctx_size`, the one
    Lemonade forwards; Ollama's `num_ctx`), applied to this load only and never saved. A model
    already resident is used as it is; options its recipe does not take are ignored."""
    if not request or svc.router.resident(model.name) is not None:
        return
    known = options_for(model.recipe)
    try:
        parsed = svc.options.parse_request(model.recipe, {k: v for k, v in request.items() if k in known})
    except OptionsError as exc:
        raise bad_request(str(exc)) from None
    await svc.router.ensure_loaded(model, lambda: svc.options.resolve(model.name, model.recipe, request=parsed))


def context_fields(lm: LoadedModel) -> dict[str, Any]:
    """What context the load gave the model and why (`ctx_size: -1` is sized to the free memory)."""
    out: dict[str, Any] = {}
    if lm.context_length is not None:
        out["context_length"] = lm.context_length
    if lm.launch.context_reason:
        out["context_reason"] = lm.launch.context_reason
    return out
