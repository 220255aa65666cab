"""`lemonade bench` scenarios: the workloads a benchmark sends, read from JSON files as Lemonade's are.

A file holds `{"scenarios": [...]}`; each scenario has a `name`, a `category` (default `general`)
and, by its category, what is sent (guide-cli.md, "Scenario Files"):

- text generation (any category but the three below): `messages`, `max_tokens` (128), and an
  optional `context` block that grows the first user message to about `target_tokens` tokens
  (4 characters a token) with its question at the `end`, `start` or `middle`;
- `vision`: `messages` and an `image_path` beside the scenario file, embedded into the first user
  message as a data URI; `max_tokens` 1024;
- `embed`: `input`, a string or a list of strings, for `/v1/embeddings`;
- `imagegen`: `prompt`, `size`, `seed`, `steps`, `cfg_scale`, for `/v1/images/generations`.

`warmup_runs` (0) and `measurement_runs` (3) may be set per scenario; `--warmup` and `--runs`
override them. A file that cannot be read, or a scenario without what its category needs, is an
error naming the file and the scenario: a benchmark of the wrong workload is worse than none.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

# Categories left out unless asked for by name (`--scenarios long-context`, `... embed`, `all`):
# long-context runs for minutes, the others need an embedding, vision or image model.
OPT_IN = ("long-context", "embed", "vision", "imagegen")
IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp",
               ".gif": "image/gif"}
CHARS_PER_TOKEN = 4
# Labels of models that generate no text from chat messages (a text scenario does not suit them).
NOT_TEXT = frozenset({"embeddings", "embedding", "embed", "reranking", "image", "upscaling", "transcription",
                      "tts", "classification"})


class ScenarioError(ValueError):
    """A scenario file or filter that cannot be used; the message names it."""


@dataclass
class Scenario:
    name: str
    category: str = "general"
    messages: list[dict[str, Any]] = field(default_factory=list)
    input: Any = None                  # embed
    image: dict[str, Any] = field(default_factory=dict)  # imagegen: prompt, size, seed, steps, cfg_scale
    image_path: Path | None = None     # vision: resolved, beside the scenario file
    max_tokens: int = 128
    warmup_runs: int = 0
    measurement_runs: int = 3

    @property
    def kind(self) -> str:
        """What is measured: `embed`, `imagegen`, `vision` or `textgen`."""
        return self.category if self.category in ("embed", "imagegen", "vision") else "textgen"

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages to send; a vision scenario's image goes into its first user message."""
        if self.kind != "vision" or self.image_path is None:
            return self.messages
        data = base64.b64encode(self.image_path.read_bytes()).decode()
        url = f"data:{IMAGE_TYPES[self.image_path.suffix.lower()]};base64,{data}"
        out = [dict(m) for m in self.messages]
        for message in out:
            if message.get("role") == "user":
                content = message.get("content")
                parts = ([{"type": "text", "text": content}] if isinstance(content, str)
                         else list(content or []))
                message["content"] = [*parts, {"type": "image_url", "image_url": {"url": url}}]
                break
        return out


def expand_context(context: dict[str, Any], messages: list[dict[str, Any]]) -> str:
    """The first user message grown to about `target_tokens` tokens of `filler`, the question placed
    by `position` (Lemonade's rule: 4 characters a token, the filler repeated whole)."""
    filler = str(context.get("filler") or "")
    if not filler:
        return ""
    target = int(context.get("target_tokens", 2000)) * CHARS_PER_TOKEN
    text = filler * -(-target // len(filler))
    question = next((m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)),
                    "Answer the question.")
    position = context.get("position", "end")
    if position == "start":
        return f"{question}\n\n{text}"
    if position == "middle":
        mid = len(text) // 2
        return f"{text[:mid]}\n\n{question}\n\n{text[mid:]}"
    return f"{text}\n\n{question}"


def _int(item: dict[str, Any], key: str, default: int, where: str) -> int:
    value = item.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "max_tokens" else 0):
        raise ScenarioError(f"{where}: '{key}' must be a {'positive' if key == 'max_tokens' else 'non-negative'} "
                            f"integer, got {value!r}")
    return value


def parse(item: Any, source: Path) -> Scenario:
    """One scenario of `source` (for its messages, the image's folder and the error messages)."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"].strip():
        raise ScenarioError(f"{source}: every scenario needs a 'name' string, got {json.dumps(item)[:80]}")
    where = f"{source}: scenario '{item['name']}'"
    category = item.get("category", "general")
    if not isinstance(category, str) or not category:
        raise ScenarioError(f"{where}: 'category' must be a string")
    s = Scenario(name=item["name"], category=category,
                 warmup_runs=_int(item, "warmup_runs", 0, where),
                 measurement_runs=_int(item, "measurement_runs", 3, where))
    if s.kind == "embed":
        s.input = item.get("input")
        if not (isinstance(s.input, str) and s.input) and not (
                isinstance(s.input, list) and s.input and all(isinstance(t, str) for t in s.input)):
            raise ScenarioError(f"{where}: an embed scenario needs 'input', a string or a list of strings")
        return s
    if s.kind == "imagegen":
        if not isinstance(item.get("prompt"), str) or not item["prompt"]:
            raise ScenarioError(f"{where}: an imagegen scenario needs a 'prompt' string")
        s.image = {k: item[k] for k in ("prompt", "size", "seed", "steps", "cfg_scale") if k in item}
        s.image.setdefault("seed", 42)
        return s
    messages = item.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m
                                                                 for m in messages):
        raise ScenarioError(f"{where}: 'messages' must be a list of chat messages (role and content)")
    s.messages = [dict(m) for m in messages]
    s.max_tokens = _int(item, "max_tokens", 1024 if s.kind == "vision" else 128, where)
    if s.kind == "vision":
        s.image_path = _image_beside(item.get("image_path"), source, where)
    elif isinstance(item.get("context"), dict):
        expanded = expand_context(item["context"], s.messages)
        for message in s.messages:
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                message["content"] = expanded
                break
    return s


def _image_beside(raw: Any, source: Path, where: str) -> Path:
    """A vision scenario's image: a file name in the scenario file's own folder (no other path)."""
    if not isinstance(raw, str) or not raw:
        raise ScenarioError(f"{where}: a vision scenario needs a non-empty 'image_path'")
    folder = source.resolve().parent
    path = (folder / raw).resolve()
    if Path(raw).is_absolute() or path.parent != folder:
        raise ScenarioError(f"{where}: 'image_path' must name a file in the scenario file's folder ({folder}), "
                            f"got {raw!r}")
    if path.suffix.lower() not in IMAGE_TYPES:
        raise ScenarioError(f"{where}: image format {path.suffix or '(none)'} is not one of "
                            f"{', '.join(sorted(IMAGE_TYPES))}")
    if not path.is_file():
        raise ScenarioError(f"{where}: image file not found: {path}")
    return path


def load_file(path: Path) -> list[Scenario]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"scenario file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("scenarios"), list):
        raise ScenarioError(f"scenario file {path} has no 'scenarios' array")
    scenarios = [parse(item, Path(path)) for item in data["scenarios"]]
    names = [s.name for s in scenarios]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ScenarioError(f"scenario file {path}: duplicate scenario name(s): {', '.join(dup)}")
    return scenarios


def load_dir(folder: Path) -> tuple[list[Scenario], list[str]]:
    """Every `*.json` of `folder` in name order; a name seen before is skipped (with a warning)."""
    if not Path(folder).is_dir():
        raise ScenarioError(f"scenario folder {folder} does not exist")
    out: list[Scenario] = []
    warnings: list[str] = []
    for path in sorted(Path(folder).glob("*.json")):
        for s in load_file(path):
            if any(s.name == o.name for o in out):
                warnings.append(f"duplicate scenario name '{s.name}' in {path.name}: skipped")
            else:
                out.append(s)
    return out, warnings


def bundled() -> list[Scenario]:
    """The scenarios that ship with lemonade (autotune/resources/bench_scenarios.json)."""
    ref = resources.files("lemonade.autotune").joinpath("resources/bench_scenarios.json")
    with resources.as_file(ref) as path:
        return load_file(path)


def select(scenarios: list[Scenario], tokens: list[str] | None) -> list[Scenario]:
    """By name or category (`all`: every one); without tokens, all but the opt-in categories."""
    if not tokens:
        return [s for s in scenarios if s.category not in OPT_IN]
    unknown = [t for t in tokens if t != "all" and not any(t in (s.name, s.category) for s in scenarios)]
    if unknown:
        names = sorted({s.name for s in scenarios} | {s.category for s in scenarios})
        raise ScenarioError(f"--scenarios {', '.join(unknown)}: no scenario has that name or category "
                            f"(there are: {', '.join(names)})")
    return [s for s in scenarios if "all" in tokens or s.name in tokens or s.category in tokens]


def suits(scenario: Scenario, labels: set[str]) -> bool:
    """Whether a model with these labels can run the scenario; Lemonade's bench skips the others
    (an embed scenario needs an embedding model, vision a `vision` one, imagegen an image model)."""
    if scenario.kind == "embed":
        return bool(labels & {"embeddings", "embedding", "embed"})
    if scenario.kind == "imagegen":
        return "image" in labels and "upscaling" not in labels
    if scenario.kind == "vision":
        return "vision" in labels
    return not labels & NOT_TEXT
