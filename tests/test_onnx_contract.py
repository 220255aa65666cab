"""The ONNX classifier contract (backends/onnxruntime/contract.py), table-driven: folder files -> contract or refusal.

Pure file reading, no engine: what `/v1/classify` will do with a model folder is decided here, in the
server, before a worker starts (architecture allow-list, manifest overrides, softmax vs. sigmoid).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lemonade.backends.onnxruntime.contract import Contract, ContractError, model_folder, read_contract

SEQ = {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
       "id2label": {"0": "neg", "1": "pos"}, "max_position_embeddings": 512}
TOK = {**SEQ, "architectures": ["BertForTokenClassification"], "id2label": {"0": "O", "1": "PER", "2": "LOC"}}


def folder(tmp_path: Path, config: dict | None, manifest: dict | None = None, tok_config: dict | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / name).write_bytes(b"x")
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    if manifest is not None:
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    if tok_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return tmp_path


ACCEPTED = [
    ("stock sequence export: single-label softmax", SEQ, None, None,
     Contract("text-classification", ("neg", "pos"), "softmax", "max", 510, "bert")),
    ("multi-label problem_type: sigmoid", {**SEQ, "problem_type": "multi_label_classification"}, None, None,
     Contract("text-classification", ("neg", "pos"), "sigmoid", "max", 510, "bert")),
    ("single_label problem_type stays softmax", {**SEQ, "problem_type": "single_label_classification"}, None, None,
     Contract("text-classification", ("neg", "pos"), "softmax", "max", 510, "bert")),
    ("token classification, max aggregation", TOK, None, None,
     Contract("token-classification", ("O", "PER", "LOC"), "softmax", "max", 510, "bert")),
    ("tokenizer budget wins over positions", {**SEQ, "model_type": "roberta"}, None, {"model_max_length": 128},
     Contract("text-classification", ("neg", "pos"), "softmax", "max", 128, "roberta")),
    ("HF's 'no limit' sentinel is ignored", {**SEQ, "model_type": "distilbert"}, None,
     {"model_max_length": 1e30}, Contract("text-classification", ("neg", "pos"), "softmax", "max", 510, "distilbert")),
    ("manifest overrides labels and normalization", SEQ,
     {"task": "text-classification", "id2label": {"0": "SAFE", "1": "INJECTION"}, "score_normalization": "sigmoid",
      "token_aggregation": None, "max_length": 64},
     None, Contract("text-classification", ("SAFE", "INJECTION"), "sigmoid", "max", 64, "bert")),
    ("manifest mean aggregation, labels from config", TOK,
     {"task": "token-classification", "token_aggregation": "mean"}, None,
     Contract("token-classification", ("O", "PER", "LOC"), "softmax", "mean", 510, "bert")),
    ("deberta-v2 is an allowed family", {**SEQ, "model_type": "deberta-v2"}, None, None,
     Contract("text-classification", ("neg", "pos"), "softmax", "max", 510, "deberta-v2")),
    ("RoBERTa pads with its own id", {**SEQ, "model_type": "roberta", "pad_token_id": 1}, None, None,
     Contract("text-classification", ("neg", "pos"), "softmax", "max", 510, "roberta", 1)),
]

REFUSED = [
    ("no config.json", None, None, "config.json is missing"),
    ("no config.json even with a manifest", None, {"task": "text-classification", "id2label": {"0": "a", "1": "b"}},
     "config.json is missing"),
    ("XLNet is another convention", {**SEQ, "model_type": "xlnet", "architectures": ["XLNetForSequenceClassification"]},
     None, "Unsupported architecture: config.json 'model_type' is 'xlnet'"),
    ("XLNet even with a manifest", {**SEQ, "model_type": "xlnet"}, {"task": "text-classification"},
     "Unsupported architecture"),
    ("no model_type", {k: v for k, v in SEQ.items() if k != "model_type"}, None, "declares no 'model_type'"),
    ("a bare encoder has no head", {**SEQ, "architectures": ["BertModel"]}, None, "the task cannot be told"),
    ("regression head", {**SEQ, "problem_type": "regression"}, None, "regression"),
    ("one label", {**SEQ, "id2label": {"0": "score"}}, None, "single-output head"),
    ("id2label with a gap", {**SEQ, "id2label": {"0": "a", "2": "b"}}, None, "indexes 0 to 1"),
    ("id2label not an index", {**SEQ, "id2label": {"a": "x", "1": "y"}}, None, "is not an output index"),
    ("id2label twice the same", {**SEQ, "id2label": {"0": "x", "1": "x"}}, None, "names a label twice"),
    ("manifest task unknown", SEQ, {"task": "summarization"}, "'task' must be one of"),
    ("manifest normalization none", SEQ, {"task": "text-classification", "score_normalization": "none"},
     "'score_normalization' must be one of"),
    ("manifest aggregation unknown", TOK, {"task": "token-classification", "token_aggregation": "first"},
     "'token_aggregation' must be one of"),
    ("manifest max_length too small", SEQ, {"task": "text-classification", "max_length": 1}, "'max_length'"),
    ("manifest unknown key", SEQ, {"task": "text-classification", "labels": ["a"]}, "unknown key(s) labels"),
]


@pytest.mark.parametrize(("case", "config", "manifest", "tok_config", "expected"), ACCEPTED,
                         ids=[c[0] for c in ACCEPTED])
def test_accepted(tmp_path, case, config, manifest, tok_config, expected):
    assert read_contract(folder(tmp_path, config, manifest, tok_config)) == expected


@pytest.mark.parametrize(("case", "config", "manifest", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused(tmp_path, case, config, manifest, message):
    with pytest.raises(ContractError) as err:
        read_contract(folder(tmp_path, config, manifest))
    assert message in str(err.value)


def test_contract_round_trips_as_json():
    contract = Contract("token-classification", ("O", "LOC"), "softmax", "mean", 128, "bert")
    assert json.loads(contract.to_json()) == {"task": "token-classification", "labels": ["O", "LOC"],
                                              "normalization": "softmax", "aggregation": "mean", "max_length": 128,
                                              "model_type": "bert", "pad_id": 0}


def test_model_folder_picks_the_complete_one(tmp_path):
    good = folder(tmp_path / "onnx", SEQ)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model.onnx").write_bytes(b"x")  # no tokenizer/config: not a candidate
    files = [good / "model.onnx", good / "config.json", tmp_path / "other" / "model.onnx"]
    assert model_folder(files) == good
    with pytest.raises(ContractError, match="one folder must hold model.onnx, tokenizer.json"):
        model_folder([tmp_path / "other" / "model.onnx"])
    second = folder(tmp_path / "b", SEQ)
    with pytest.raises(ContractError, match="Ambiguous model layout: 2 folders"):
        model_folder(files + [second / "model.onnx"])
