"""ONNX Runtime classifier worker: one exported encoder classifier behind a tiny HTTP server.

Run by the onnxruntime engine with the engine's private venv (onnxruntime, tokenizers, numpy):
    python classify_worker.py --model DIR --contract JSON --port N [--threads T]

The server has read the folder's config.json / manifest.json into the contract (task, labels,
softmax or sigmoid, token aggregation, token budget: backends/onnxruntime/contract.py); this worker only
runs it. `POST /classify {"texts": [...], "top_k": N|null}` answers `{"results": [{"labels":
{label: score}}, ...]}`, one per text, labels highest first.

Input convention (the single-sequence encoder families the server lets through): the model's own
`tokenizer.json` with its post-processor's [CLS]/[SEP] (or <s>/</s>), truncated to the budget by the
tokenizer (so the closing special token stays), the tokenizer's own fixed padding turned off (the
reference pipelines do not pad one text: padding it would change the scores), zero token_type_ids.
A batch is padded to its longest text with the pad id and a zero attention mask. Token
classification scores each content token (the special tokens the tokenizer inserted, and padding,
are left out, as Hugging Face's pipeline does) and aggregates each label over the tokens: `max`
(is the label anywhere?) or `mean`. A text with no content token is a 400.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from worker_http import JSONHandler

MODEL: Any = None
BATCH = 16  # texts per session run
MAX_BODY = 64 << 20


class BadRequest(ValueError):
    """The client's mistake, answered with a 400."""


class Classifier:
    def __init__(self, folder: str, contract: dict[str, Any], threads: int) -> None:
        import numpy as np
        import onnxruntime
        from tokenizers import Tokenizer

        self.np = np
        self.task: str = contract["task"]
        self.labels: list[str] = list(contract["labels"])
        self.sigmoid = contract["normalization"] == "sigmoid"
        self.mean = contract.get("aggregation") == "mean"
        self.tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
        padding = self.tokenizer.padding or {}
        self.pad_id = int(padding.get("pad_id", contract.get("pad_id", 0)))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=int(contract["max_length"]))
        self.lock = threading.Lock()  # the Rust tokenizer is not shared across threads here
        opts = onnxruntime.SessionOptions()
        if threads > 0:
            opts.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(f"{folder}/model.onnx", sess_options=opts,
                                                    providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        unknown = [n for n in self.inputs if n not in ("input_ids", "attention_mask", "token_type_ids")]
        if unknown:
            raise SystemExit(f"classify-worker: model.onnx takes input(s) {', '.join(unknown)}: not a plain encoder "
                             "classifier export (input_ids / attention_mask / token_type_ids -> logits)")
        first = self.session.get_inputs()[0].shape
        self.batchable = not (first and isinstance(first[0], int) and first[0] == 1)
        self.classify(["hello world"], None)  # the output shape is checked now, not on the first request

    def _normalize(self, logits: Any) -> Any:
        np = self.np
        if self.sigmoid:
            return 1.0 / (1.0 + np.exp(-logits))
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)

    def _run(self, encodings: list[Any]) -> Any:
        np = self.np
        width = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            ids[row, :len(enc.ids)] = enc.ids
            mask[row, :len(enc.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        logits = self.session.run(None, {n: feed[n] for n in self.inputs})[0]
        if logits.dtype != np.float32:
            raise RuntimeError(f"model output is {logits.dtype}, not float32 logits")
        want = 3 if self.task == "token-classification" else 2
        if logits.ndim != want or logits.shape[-1] != len(self.labels):
            raise RuntimeError(f"model output has shape {list(logits.shape)}; the {self.task} contract expects "
                               f"rank {want} with {len(self.labels)} labels (id2label) last")
        return logits

    def _scores(self, enc: Any, logits: Any) -> Any:
        if self.task != "token-classification":
            return self._normalize(logits)
        np = self.np
        keep = np.array([m == 0 for m in enc.special_tokens_mask], dtype=bool)
        per_token = self._normalize(logits[:len(enc.ids)][keep])
        if per_token.shape[0] == 0:
            raise BadRequest("the text has no content tokens to classify (it tokenizes to special tokens only)")
        return per_token.mean(axis=0) if self.mean else per_token.max(axis=0)

    def classify(self, texts: list[str], top_k: int | None) -> list[dict[str, float]]:
        with self.lock:
            encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        size = BATCH if self.batchable else 1
        out: list[dict[str, float]] = []
        for start in range(0, len(encodings), size):
            chunk = encodings[start:start + size]
            logits = self._run(chunk)
            for row, enc in enumerate(chunk):
                try:
                    scores = self._scores(enc, logits[row])
                except BadRequest as exc:
                    raise BadRequest(f"input {start + row}: {exc}" if len(texts) > 1 else str(exc)) from None
                ranked = sorted(zip(self.labels, (float(s) for s in scores), strict=True), key=lambda kv: -kv[1])
                out.append(dict(ranked[:top_k] if top_k else ranked))
        return out


class Handler(JSONHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if urlsplit(self.path).path == "/health":
            self._reply(200 if MODEL is not None else 503, {"status": "ok" if MODEL is not None else "loading"})
        else:
            self._reply(404, {"error": {"message": f"Unknown path {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        if urlsplit(self.path).path != "/classify":
            self._reply(404, {"error": {"message": f"Unknown path {self.path}"}})
            return
        if MODEL is None:
            self._reply(503, {"error": {"message": "The model is still loading"}})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            if length > MAX_BODY:
                raise BadRequest(f"request body of {length} bytes is too large")
            body = json.loads(self.rfile.read(length) or b"{}")
            texts, top_k = body.get("texts"), body.get("top_k")
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise BadRequest("'texts' must be a non-empty list of strings")
            if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
                raise BadRequest("'top_k' must be a positive integer")
            started = time.perf_counter()
            results = MODEL.classify(texts, top_k)
        except BadRequest as exc:
            self._reply(400, {"error": {"message": str(exc), "code": "invalid_argument"}})
            return
        except ValueError as exc:  # JSON that does not parse
            self._reply(400, {"error": {"message": f"body is not JSON: {exc}", "code": "invalid_json"}})
            return
        except Exception as exc:  # noqa: BLE001 - reported to the server, which reports it to the client
            self._reply(500, {"error": {"message": f"Classification failed: {type(exc).__name__}: {exc}"}})
            return
        self._reply(200, {"results": [{"labels": labels} for labels in results],
                          "processing_seconds": time.perf_counter() - started})


def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--contract", required=True,
                        help="the output contract as JSON (backends/onnxruntime/contract.py)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.perf_counter()
    MODEL = Classifier(args.model, json.loads(args.contract), args.threads)
    print(f"classifier loaded from {args.model} in {time.perf_counter() - started:.2f}s "
          f"({MODEL.task}, {len(MODEL.labels)} labels)", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
