"""What an ONNX text classifier's folder promises: task, labels, normalization, token budget.

Read in the server before any worker starts (api-lemonade.md `POST /v1/classify`): a servable
folder is `model.onnx` + `tokenizer.json` + `config.json`. `config.json` is always required, because
its `model_type` must be one of the single-sequence encoder families whose input convention the
worker implements (all-ones attention mask, zero `token_type_ids`, [CLS]/[SEP] from the
tokenizer's own post-processor); another family (XLNet, ...) is refused at load time rather than
served with wrong scores. The output contract comes from that config (`architectures` gives the
task, `id2label` the labels, `problem_type: multi_label_classification` sigmoid instead of the
default single-label softmax); an optional `manifest.json` overrides it, checked strictly. The
worker receives the result as JSON (`Contract.to_json`) and only runs it.

Pure: files in, a `Contract` or a `ContractError` (whose message says what to fix) out.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REQUIRED_FILES = ("model.onnx", "tokenizer.json", "config.json")
# config.json `model_type` of the supported families: BERT, DistilBERT, RoBERTa, XLM-RoBERTa,
# DeBERTa (v1/v2), ELECTRA, ALBERT, CamemBERT.
SUPPORTED_MODEL_TYPES = ("albert", "bert", "camembert", "deberta", "deberta-v2", "distilbert", "electra", "roberta",
                         "xlm-roberta")
TASKS = ("text-classification", "token-classification")
NORMALIZATIONS = ("softmax", "sigmoid")
AGGREGATIONS = ("max", "mean")
DEFAULT_MAX_LENGTH = 512
MANIFEST_KEYS = ("task", "id2label", "score_normalization", "token_aggregation", "max_length")


class ContractError(ValueError):
    """The folder cannot be served as it is; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Contract:
    task: str  # "text-classification" | "token-classification"
    labels: tuple[str, ...]  # by output index
    normalization: str = "softmax"  # "softmax" | "sigmoid"
    aggregation: str = "max"  # token classification: how a label's per-token scores become one score
    max_length: int = DEFAULT_MAX_LENGTH  # token budget; longer inputs are truncated
    model_type: str = ""
    pad_id: int = 0  # fills a batch's shorter texts (config.json `pad_token_id`, when the tokenizer names none)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "labels": list(self.labels)})


def model_folder(paths: list[Path]) -> Path:
    """The one folder among a model's files that holds every required file."""
    found = sorted({p.parent for p in paths if p.name == "model.onnx"
                    and all((p.parent / name).is_file() for name in REQUIRED_FILES)})
    if not found:
        have = sorted({p.name for p in paths})
        raise ContractError("No servable ONNX classifier folder: one folder must hold model.onnx, tokenizer.json "
                            "and config.json (manifest.json is optional); the model's files are "
                            f"{', '.join(have) or 'none'}")
    if len(found) > 1:
        raise ContractError(f"Ambiguous model layout: {len(found)} folders hold a complete ONNX classifier "
                            f"({', '.join(str(f) for f in found)}); keep exactly one")
    return found[0]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ContractError(f"{path.name} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ContractError(f"{path.name} must hold a JSON object")
    return data


def _labels(id2label: Any, origin: str) -> tuple[str, ...]:
    if not isinstance(id2label, dict) or not id2label:
        raise ContractError(f"{origin}: 'id2label' is missing or empty")
    labels: dict[int, str] = {}
    for key, value in id2label.items():
        if not str(key).isdigit():
            raise ContractError(f"{origin}: 'id2label' key '{key}' is not an output index")
        if not isinstance(value, str) or not value:
            raise ContractError(f"{origin}: 'id2label' value for {key} must be a non-empty string")
        labels[int(key)] = value
    if sorted(labels) != list(range(len(labels))):
        raise ContractError(f"{origin}: 'id2label' keys must be the indexes 0 to {len(labels) - 1}, each once")
    if len(set(labels.values())) != len(labels):
        raise ContractError(f"{origin}: 'id2label' names a label twice")
    return tuple(labels[i] for i in range(len(labels)))


def _check_family(config: dict[str, Any]) -> str:
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ContractError("config.json declares no 'model_type', so the architecture cannot be checked against "
                            f"the supported encoder families ({', '.join(SUPPORTED_MODEL_TYPES)})")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ContractError(f"Unsupported architecture: config.json 'model_type' is '{model_type}'. The onnxruntime "
                            "engine serves single-sequence encoder classifiers only (all-ones attention mask, zero "
                            f"token_type_ids): {', '.join(SUPPORTED_MODEL_TYPES)}. Other families use other "
                            "segment and special-token conventions and would get wrong scores.")
    return model_type


def _inferred_max_length(folder: Path, config: dict[str, Any]) -> int:
    """The tokenizer's declared budget, else the position table (less 2: RoBERTa-style configs count
    padding positions), else 512. HF writes a huge float when a tokenizer has no limit: skipped."""
    tok_config = folder / "tokenizer_config.json"
    if tok_config.is_file():
        try:
            value = json.loads(tok_config.read_text(encoding="utf-8")).get("model_max_length")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            value = None
        if isinstance(value, int) and not isinstance(value, bool) and 2 <= value <= 1_000_000:
            return value
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool) and 2 <= positions <= 1_000_000:
        return positions - 2 if positions > 4 else positions
    return DEFAULT_MAX_LENGTH


def _pad_id(config: dict[str, Any]) -> int:
    value = config.get("pad_token_id")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _from_config(folder: Path, config: dict[str, Any], model_type: str) -> Contract:
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    if arch.endswith("ForTokenClassification"):
        task = "token-classification"
    elif arch.endswith("ForSequenceClassification"):
        task = "text-classification"
    else:
        raise ContractError(f"config.json 'architectures' is {archs!r}: the task cannot be told from it (expected "
                            "a ...ForSequenceClassification or ...ForTokenClassification head); add a manifest.json "
                            "with 'task'")
    problem = config.get("problem_type")
    if problem == "regression":
        raise ContractError("config.json 'problem_type' is 'regression': a regression head has no label scores "
                            "in [0, 1]")
    sigmoid = task == "text-classification" and problem == "multi_label_classification"
    labels = _labels(config.get("id2label"), "config.json")
    if len(labels) < 2:
        raise ContractError("config.json 'id2label' has one label: a single-output head has no label scores in "
                            "[0, 1]; add a manifest.json if it is a sigmoid head")
    return Contract(task, labels, "sigmoid" if sigmoid else "softmax", "max", _inferred_max_length(folder, config),
                    model_type, _pad_id(config))


def _from_manifest(folder: Path, manifest: dict[str, Any], config: dict[str, Any], model_type: str) -> Contract:
    unknown = sorted(set(manifest) - set(MANIFEST_KEYS))
    if unknown:
        raise ContractError(f"manifest.json: unknown key(s) {', '.join(unknown)} (known: {', '.join(MANIFEST_KEYS)})")
    task = manifest.get("task")
    if task not in TASKS:
        raise ContractError(f"manifest.json: 'task' must be one of {', '.join(TASKS)}, got {task!r}")
    normalization = manifest.get("score_normalization", "softmax")
    if normalization not in NORMALIZATIONS:
        raise ContractError(f"manifest.json: 'score_normalization' must be one of {', '.join(NORMALIZATIONS)}, got "
                            f"{normalization!r}")
    aggregation = manifest.get("token_aggregation")
    if aggregation is None:
        aggregation = "max"
    elif aggregation not in AGGREGATIONS:
        raise ContractError(f"manifest.json: 'token_aggregation' must be one of {', '.join(AGGREGATIONS)} or null, "
                            f"got {aggregation!r}")
    if "max_length" in manifest:
        max_length = manifest["max_length"]
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
            raise ContractError(f"manifest.json: 'max_length' must be an integer of at least 2, got {max_length!r}")
    else:
        max_length = _inferred_max_length(folder, config)
    labels = _labels(manifest.get("id2label", config.get("id2label")), "manifest.json")
    return Contract(task, labels, normalization, aggregation, max_length, model_type, _pad_id(config))


def read_contract(folder: Path) -> Contract:
    """The contract of a servable folder (see the module docstring), or ContractError."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ContractError(f"config.json is missing in {folder}: it is required (even with a manifest.json) to "
                            "check the model's architecture")
    config = _read_json(config_path)
    model_type = _check_family(config)
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        return _from_manifest(folder, _read_json(manifest_path), config, model_type)
    return _from_config(folder, config, model_type)
