"""Makes the suite's test models once per machine, before pytest runs (`.ci/run`).

The fixtures make them on first use and cache them under $LEMONADE_TEST_CACHE (the trained
classifiers, MiniLM converted to GGUF, the random-weight reranker, Whisper, SD, SDXL, Flux and
ESRGAN files), but on a new, busy machine the first ones took longer than a test's time limit
(pytest-timeout) and failed the tests that asked for them. Made here, with no time limit and
progress in the CI log, the suite only finds them cached. Each builder is the fixtures' own.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.classifier_models import classifier_models  # noqa: E402
from tests.ggml_whisper import tiny_random_whisper_ggml  # noqa: E402
from tests.models import minilm_gguf, tiny_reranker_gguf  # noqa: E402
from tests.sd_factory import flux2_klein_model, sdxl_model, tiny_esrgan_model, tiny_sd1_model  # noqa: E402

BUILDERS: list[tuple[str, Callable[[], object]]] = [
    ("all-MiniLM-L6-v2 GGUF (converted)", minilm_gguf),
    ("random-weight reranker", tiny_reranker_gguf),
    ("trained ONNX classifiers", classifier_models),
    ("random-weight Whisper (ggml)", tiny_random_whisper_ggml),
    ("random-weight SD 1.x", tiny_sd1_model),
    ("random-weight Real-ESRGAN", tiny_esrgan_model),
    ("random-weight Flux.2 Klein files", flux2_klein_model),
    ("random-weight SDXL", sdxl_model),
]


def main() -> None:
    for name, build in BUILDERS:
        started = time.monotonic()
        build()
        print(f"   {name}: {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
