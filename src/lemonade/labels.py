"""Model labels and the deployment-mode rules of openai.md "Model Labels".

A model deploys in exactly one mode; the mode must be one its recipe serves; with no mode label
the recipe's default applies. The messages are the spec's, word for word, because clients show
them to users.
"""

from __future__ import annotations

from collections.abc import Iterable

from lemonade.recipes import label_modes, recipe_modes

# Canonical deployment labels and their accepted aliases.
MODE_ALIASES = {
    "chat": "chat",
    "transcription": "transcription",
    "embeddings": "embeddings",
    "embedding": "embeddings",
    "reranking": "reranking",
    "image": "image",
    "tts": "tts",
    "audio-generation": "audio-generation",
    "classification": "classification",
    "classifier": "classification",
    "3d": "3d",
}

ROUTER_RECIPE = "collection.router"  # a policy that sends each request to one of its members (routing/)
COLLECTION_RECIPES = ("collection.omni", ROUTER_RECIPE)
# A collection's own `system_prompt` is a template: the omni loop fills these in (omni/toolset.py).
OMNI_PLACEHOLDERS = ("{tool_list}", "{tool_guidance}")


# Residency type per mode (the keys of `max_models` in /v1/health).
MODE_TYPE = {
    "chat": "llm",
    "embeddings": "embedding",
    "reranking": "reranking",
    "transcription": "transcription",
    "image": "image",
    "tts": "tts",
    "audio-generation": "audio",
    "classification": "classification",
    "3d": "3d",
}
MODEL_TYPES = ("llm", "embedding", "reranking", "transcription", "image", "tts")


class LabelError(ValueError):
    pass


def _quote(items: Iterable[str]) -> str:
    return ", ".join(f"'{i}'" for i in items)


def claimed_modes(labels: Iterable[str], embedding: bool = False, reranking: bool = False) -> list[str]:
    """Distinct canonical modes named by labels and the legacy booleans, in order of appearance."""
    modes: list[str] = []
    for label in list(labels) + (["embeddings"] if embedding else []) + (["reranking"] if reranking else []):
        mode = MODE_ALIASES.get(label)
        if mode and mode not in modes:
            modes.append(mode)
    return modes


def deployment_mode(model_name: str, recipe: str, labels: Iterable[str], embedding: bool = False,
                    reranking: bool = False) -> str:
    """The one mode this model deploys in, or LabelError with the spec's message."""
    if recipe in COLLECTION_RECIPES:
        return "collection"
    labels = list(labels)
    modes_by_recipe = recipe_modes()
    served = modes_by_recipe.get(recipe)
    if served is None:
        known = tuple(modes_by_recipe) + COLLECTION_RECIPES
        raise LabelError(f"Model '{model_name}': unknown recipe '{recipe}'. Known recipes: {_quote(known)}.")
    modes = claimed_modes(labels, embedding, reranking)
    if len(modes) > 1:
        raise LabelError(
            f"Model '{model_name}': a model deploys in exactly one mode, but these labels name two: "
            f"'{modes[0]}' and '{modes[1]}'. Register one model per mode.")
    if modes and modes[0] not in served and not _served_with_label(recipe, modes[0], labels):
        raise LabelError(
            f"Model '{model_name}': recipe '{recipe}' cannot serve '{modes[0]}'. It serves {_quote(served)}. "
            f"Omit the label to deploy as '{served[0]}'.")
    return modes[0] if modes else served[0]


def _served_with_label(recipe: str, mode: str, labels: Iterable[str]) -> bool:
    """A mode the recipe serves only together with another label (e.g. `classification` with
    `systemone` on llama.cpp: a decision model)."""
    return any(mode in modes for label, modes in label_modes(recipe).items() if label in labels)


def model_type(mode: str) -> str:
    return MODE_TYPE.get(mode, "llm")
