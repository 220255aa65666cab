"""Model ids (guide-configuration-custom-models.md, "Model naming spec").

Every model has a canonical id `<source>.<bare name>`: `user.NAME` (registered, `user_models.json`),
`extra.NAME` (a GGUF in the extra models dir), `builtin.NAME` (the built-in catalog). The bare name
is an alias for whichever source wins it, by precedence registered > imported > built-in. Listings
show the winner under its bare name and every shadowed model under its canonical id, so each row is
a name that resolves back to that very model. These rules live here, as pure functions, so the
catalog, the recipe options store and the tests share one reading of the spec.
"""

from __future__ import annotations

from collections.abc import Iterable

USER, EXTRA, BUILTIN = "user", "extra", "builtin"
PRECEDENCE = (USER, EXTRA, BUILTIN)  # registered > imported > built-in
PREFIXES = {origin: origin + "." for origin in PRECEDENCE}


def canonical(origin: str, bare: str) -> str:
    return PREFIXES[origin] + bare


def split(name: str) -> tuple[str | None, str]:
    """(origin, bare name) of a canonical id; (None, name) for a bare name."""
    for origin, prefix in PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return origin, name[len(prefix):]
    return None, name


def reserved_problem(model_name: str) -> str | None:
    """Why a name cannot be registered, or None. Only `user.` names are registered; `extra.` and
    `builtin.` belong to the other sources, and `user.builtin.X` (or `user.extra.X`, `user.user.X`)
    would list as `builtin.X` and so on, a name that already means another model."""
    origin, bare = split(model_name)
    if origin in (EXTRA, BUILTIN):
        return (f"Model '{model_name}': the '{PREFIXES[origin]}' prefix is reserved for "
                f"{'models in the extra models dir' if origin == EXTRA else 'built-in models'}; register new "
                f"models under 'user.', e.g. 'user.{bare}'")
    inner, rest = split(bare)
    if origin == USER and inner is not None:
        return (f"Model '{model_name}': the name after 'user.' cannot start with the reserved prefix "
                f"'{PREFIXES[inner]}' (it would read as a {inner} model's id); use e.g. 'user.{rest}'")
    return None


def public_ids(canonical_ids: Iterable[str], always_prefixed: Iterable[str] = (),
               claims: Iterable[str] = ()) -> dict[str, str]:
    """canonical id -> the id listings show: the bare name for the precedence winner of that bare
    name, the canonical id for every model it shadows. A bare name that itself looks prefixed
    (an extra file named `builtin.x.gguf`) is never shown bare: it would resolve elsewhere.

    `always_prefixed` ids are shown under their canonical id even when they win: Lemonade lists a
    registered or imported collection (`collection.omni`, `collection.router`) as `user.NAME`, the
    id it was registered, fetched and chatted with (its bare name still resolves to it).

    `claims` are canonical names that resolve but are never listed (a split extra folder's old name):
    they win their bare name by the same precedence, so the model they shadow is listed by its
    canonical id and the bare name is not listed at all."""
    forced = {cid for cid in always_prefixed if split(cid)[0] in (USER, EXTRA)}
    winners: dict[str, tuple[int, str]] = {}
    ids = list(canonical_ids)
    for cid in [*ids, *claims]:
        origin, bare = split(cid)
        if origin is None:
            continue
        rank = PRECEDENCE.index(origin)
        if bare not in winners or rank < winners[bare][0]:
            winners[bare] = (rank, cid)
    out: dict[str, str] = {}
    for cid in ids:
        origin, bare = split(cid)
        shown_bare = (origin is not None and winners[bare][1] == cid and split(bare)[0] is None
                      and cid not in forced)
        out[cid] = bare if shown_bare else cid
    return out
