"""Request schemas of the Lemonade-native routes (`/v1/load`, `/v1/unload`, `/v1/pull`, `/v1/delete`,
`/v1/downloads/control`, `/v1/models/{id}/options`).

They validate the fields the routes rely on, so a bad value gets a 400 naming the field, and they
document the bodies in /openapi.json. Recipe options are validated by the options layer against
the model's recipe (a model's recipe is only known once its name is resolved); the schema lists
every option any engine takes, generated from the engine descriptions.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from lemonade.runtime.options import all_options

_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}


def _option_schema(type_: type | tuple[type, ...]) -> dict[str, Any]:
    types = type_ if isinstance(type_, tuple) else (type_,)
    names = sorted({_JSON_TYPES[t] for t in types if t in _JSON_TYPES})
    names = ["number"] if names == ["integer", "number"] else names
    return {"type": names[0] if len(names) == 1 else names}


def _add_option_properties(schema: dict[str, Any]) -> None:
    """Document the recipe options (`ctx_size`, `llamacpp_args`, `auto_evict`, ...) as properties."""
    props = schema.setdefault("properties", {})
    for name, option in sorted(all_options().items()):
        props.setdefault(name, {**_option_schema(option.type), "description": "Recipe option (see "
                                "/v1/models/{id}/options); null skips the model's saved value"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _Named(_Body):
    model_name: str = Field(..., validation_alias=AliasChoices("model_name", "model"), examples=["Qwen3-0.6B-GGUF"],
                            description="The model's name (`model` is accepted too)")

    @field_validator("model_name")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty string")
        return value.strip()


class LoadRequest(_Named):
    """Recipe options ride along as extra fields; they apply to this load only unless saved."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_add_option_properties)
    pinned: bool | None = Field(None, description="Keep it loaded: never evicted to make room (null: as saved)")
    save_options: bool = Field(False, description="Store this request's options as the model's saved options")
    stream: bool = Field(False, description="Answer with SSE progress events, then `complete` or `error`")


class UnloadRequest(_Body):
    model_name: str | None = Field(None, validation_alias=AliasChoices("model_name", "model"),
                                   description="The model to unload; absent: every loaded model")


class PullRequest(_Named):
    """Registration fields (`checkpoint`, `checkpoints`, `recipe`, `labels`, `mmproj`, `components`,
    `recipe_options`, ...) create a `user.` model first; they are checked by the catalog."""

    model_config = ConfigDict(extra="allow", strict=True)
    stream: bool | None = Field(None, description="SSE progress events instead of one JSON answer")
    subscribe: bool | None = Field(None, description="With stream: false answers at once with the job")
    do_not_upgrade: bool | None = Field(None, description="Keep the downloaded revision even if newer exists")
    source: str | None = Field(None, description="huggingface or modelscope")
    registry_source: str | None = Field(None, description="Alias of source")
    checkpoint: str | None = Field(None, examples=["unsloth/Phi-4-mini-instruct-GGUF:Q4_K_M"])
    checkpoints: dict[str, Any] | None = Field(None, description="role -> checkpoint (main, mmproj, vae, ...)")
    recipe: str | None = Field(None, examples=["llamacpp"])
    labels: list[Any] | None = None
    recipe_options: dict[str, Any] | None = None


class DeleteRequest(_Named):
    pass


class DownloadControlRequest(_Body):
    id: str = Field(..., min_length=1, examples=["model:Qwen3-0.6B-GGUF"])
    action: Literal["pause", "cancel", "remove"]


class OptionsRequest(_Body):
    """The options to save; a null value removes the saved one."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_add_option_properties)
    dry_run: bool = Field(False, description="Validate and show the result without saving")
