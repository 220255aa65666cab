"""The onnxruntime engine: encoder text classifiers on ONNX Runtime, a worker process of ours per model.

Lemonade's `onnxruntime` recipe (`/v1/classify`, api-lemonade.md). Upstream runs its `ort-server`
binary; here the backend is ONNX Runtime and Hugging Face `tokenizers` (pinned) in a private venv
(`venv_install.py`), and a loaded model is `workers/classify_worker.py` run with that venv's Python.
A model is a stock `optimum-cli export onnx` folder: `model.onnx` + `tokenizer.json` + `config.json`
(+ an optional `manifest.json`). The folder is checked here, in the server, before any process
starts (`backends/onnxruntime/contract.py`): an architecture outside the supported encoder families, or a contract
that cannot be read, refuses the load with a 400 that says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemonade.backends.engine import EngineUnavailable, Launch
from lemonade.backends.onnxruntime.contract import ContractError, model_folder, read_contract
from lemonade.backends.python_engine import PythonEngine

if TYPE_CHECKING:
    from lemonade.model_info import ModelInfo

ONNXRUNTIME_VERSION = "1.32.0"
WORKER = Path(__file__).parent.parent / "workers" / "classify_worker.py"


class OnnxRuntimeEngine(PythonEngine):
    # memory rule (Engine.memory_need; measured on this machine, docs/memory.md):
    # a MiniLM classifier (87 MiB) peaked at 173 MiB on batches of 8
    memory_base_bytes = 100 << 20
    memory_per_weight_byte = 1.0
    recipe = "onnxruntime"
    packages = (f"onnxruntime=={ONNXRUNTIME_VERSION}", "tokenizers==0.23.3", "numpy==2.4.6")
    probe = "import onnxruntime, tokenizers, numpy"
    process = "classify-worker"
    endpoints = {"classify": "/classify"}

    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        try:
            folder = model_folder([p for paths in files.values() for p in paths])
            contract = read_contract(folder)
        except ContractError as exc:
            raise EngineUnavailable(f"Model {model.public} cannot be served by the onnxruntime engine: {exc}",
                                    code="model_load_refused") from None
        return await self.start_worker(model, WORKER, [
            "--model", str(folder), "--contract", contract.to_json(),
            "--threads", str(options.get("onnxruntime_threads") or 0)], options, backend, port)
