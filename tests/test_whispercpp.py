"""The whisper.cpp engine (`whispercpp` recipe): a real `whisper-server` built from the pinned
whisper.cpp v1.8.5 sources, serving the catalog's `Whisper-Tiny` through our
`/v1/audio/transcriptions`.

The model is NOT real Whisper: no offline package carries ggml Whisper weights, so the local hub
serves `ggerganov/whisper.cpp:ggml-tiny.bin` as a RANDOM-weight model at the real tiny
architecture (`tests/ggml_whisper.py`). whisper-server loads it, encodes the audio and decodes
tokens of a made-up vocabulary: the transcripts mean nothing, and these tests check the engine
path and the response shapes, never words. (faster-whisper's tests check real transcripts.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from lemonade.backends.whispercpp.engine import LANGUAGES, transcription_fields, transcription_result
from lemonade.backends.whispercpp.flags import check_whispercpp_args
from lemonade.backends.whispercpp.install import WHISPER_CPP_VERSION
from lemonade.errors import APIError
from lemonade.system.devices import detect_devices
from tests.ggml_whisper import FILE_NAME, tiny_random_whisper_ggml
from tests.helpers import TEST_CACHE, loaded
from tests.helpers import transcribe as transcribe_with

MODEL = "Whisper-Tiny"  # catalog: ggerganov/whisper.cpp:ggml-tiny.bin, recipe whispercpp
REPO = "ggerganov/whisper.cpp"


def publish_ggml(hub) -> None:
    """The random-weight model as the hub file the catalog entry names (real huggingface_hub download)."""
    if not (hub.scratch / REPO / FILE_NAME).is_file():
        hub.create_repo(REPO, {FILE_NAME: tiny_random_whisper_ggml()})


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory) -> Path:
    """A spoken sentence by espeak-ng, 16 kHz mono WAV."""
    out = tmp_path_factory.mktemp("speech") / "fox.wav"
    raw = out.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(raw), "The quick brown fox jumps over the lazy dog."],
                   check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", str(out)], check=True)
    return out


def wav_seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


@pytest.fixture(scope="module")
def server(module_servers, hub_server, whispercpp_backend):
    publish_ggml(hub_server)
    return module_servers(env=hub_server.env(), engines=("whispercpp",))


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


def transcribe(http, path: Path, **fields) -> httpx.Response:
    return transcribe_with(http, path, model=MODEL, **fields)


def test_flag_rules():
    """Per request: the allow-list; server-wide (trusted): any known flag but Lemonade's own."""
    assert check_whispercpp_args("-t 2 -bs 5 -nf --prompt 'a b'") == ["-t", "2", "-bs", "5", "-nf", "--prompt", "a b"]
    for args in ("--convert", "--tmp-dir /tmp", "-vm x.bin", "-debug"):
        with pytest.raises(ValueError, match="whispercpp.args"):
            check_whispercpp_args(args)
        assert check_whispercpp_args(args, trusted=True)
    for args, trusted in (("--port 1", True), ("--model m.bin", True), ("--inference-path /x", True)):
        with pytest.raises(ValueError, match="Lemonade sets"):
            check_whispercpp_args(args, trusted=trusted)
    with pytest.raises(ValueError, match="not a flag whisper-server"):
        check_whispercpp_args("--help", trusted=True)  # it would print the usage and exit at start


def test_verbose_json_becomes_the_engine_neutral_result():
    """whisper-server's verbose_json (as v1.8.5 writes it) read into the shape audio.py formats."""
    answer = {"task": "transcribe", "language": "haitian creole", "duration": 2.78, "text": " a b\n",
              "segments": [{"id": 0, "text": " a", "start": 0.0, "end": 1.5, "tokens": [1], "words": [],
                            "temperature": 0.0, "avg_logprob": -0.5, "no_speech_prob": 0.01},
                           {"id": 1, "text": " b"}]}  # -nt: no timestamps
    result = transcription_result(json.dumps(answer).encode())
    assert result["text"] == "a b" and result["language"] == "ht" and result["duration"] == 2.78
    assert result["segments"][0] == {"id": 0, "seek": 0, "start": 0.0, "end": 1.5, "text": " a", "tokens": [1],
                                     "temperature": 0.0, "avg_logprob": -0.5, "no_speech_prob": 0.01}
    assert result["segments"][1] == {"id": 1, "seek": 0, "start": 0.0, "end": 2.78, "text": " b"}
    with pytest.raises(APIError, match="'language'"):
        transcription_fields("language=xx")
    assert transcription_fields("language=EN&prompt=hi&temperature=0.2&other=1") == {
        "response_format": "verbose_json", "language": "en", "prompt": "hi", "temperature": "0.2"}


def test_system_info_shows_whispercpp_installed(http):
    info = http.get("/v1/system-info").json()["recipes"]["whispercpp"]
    gpu = bool(detect_devices().vulkan_gpus)  # `auto`: vulkan on a Vulkan GPU (tests/test_vulkan_media.py)
    assert info["default_backend"] == ("vulkan" if gpu else "cpu")
    cpu = info["backends"]["cpu"]
    assert cpu["state"] == "installed" and cpu["version"] == WHISPER_CPP_VERSION and cpu["devices"] == ["cpu"]
    assert cpu["message"] == "" and cpu["action"] == ""
    assert info["backends"]["vulkan"]["state"] == ("installable" if gpu else "unsupported")
    assert info["backends"]["npu"]["state"] == "unsupported"  # listed as upstream does, truthfully not here
    for name in ("vulkan", "npu"):
        assert info["backends"][name]["message"]


def test_json_and_verbose_json_with_the_official_client(server, http, speech_wav):
    """Random weights: the text is meaningless, the shapes are what an OpenAI client reads."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with open(speech_wav, "rb") as fh:
        plain = client.audio.transcriptions.create(model=MODEL, file=fh)
    assert isinstance(plain.text, str)
    model = loaded(http)[MODEL]
    assert model["recipe"] == "whispercpp" and model["type"] == "transcription"
    with open(speech_wav, "rb") as fh:
        verbose = client.audio.transcriptions.create(model=MODEL, file=fh, response_format="verbose_json",
                                                     temperature=0.0, prompt="A sentence about a fox.")
    assert verbose.language in LANGUAGES  # whisper.cpp's full name turned back into a code
    assert abs(verbose.duration - wav_seconds(speech_wav)) < 0.05  # the engine decoded the real audio
    assert isinstance(verbose.segments, list)
    for i, seg in enumerate(verbose.segments):
        assert seg.id == i and isinstance(seg.text, str)
        assert isinstance(seg.start, float) and isinstance(seg.end, float) and seg.start >= 0
    assert verbose.text == "".join(s.text for s in verbose.segments).strip()


def test_language_field(http, speech_wav):
    german = transcribe(http, speech_wav, response_format="verbose_json", language="de")
    assert german.status_code == 200 and german.json()["language"] == "de"  # asked for, so used
    bad = transcribe(http, speech_wav, language="xx")
    assert bad.status_code == 400 and "'language'" in bad.json()["error"]["message"]


@pytest.mark.parametrize("fmt,media", [("text", "text/plain"), ("srt", "text/plain"),
                                       ("vtt", "text/plain")])
def test_text_and_subtitle_formats(http, speech_wav, fmt, media):
    resp = transcribe(http, speech_wav, response_format=fmt)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(media)
    body = resp.text
    if fmt == "text":
        assert body.endswith("\n")
        return
    if fmt == "vtt":
        assert body.startswith("WEBVTT\n\n")
        body = body[len("WEBVTT\n\n"):]
    for n, cue in enumerate(c for c in body.split("\n\n") if c.strip()):
        lines = cue.split("\n")
        if fmt == "srt":
            assert lines.pop(0) == str(n + 1)
        start, arrow, end = lines[0].partition(" --> ")
        assert arrow and len(start) == len(end) == 12, cue  # 00:00:00,000


def test_undecodable_audio_is_a_400_naming_the_file(http, tmp_path):
    garbage = tmp_path / "noise.wav"
    garbage.write_bytes(os.urandom(3000))
    resp = transcribe(http, garbage)
    assert resp.status_code == 400, resp.text
    assert "'file'" in resp.json()["error"]["message"] and "audio" in resp.json()["error"]["message"]


def test_whispercpp_args_allow_list(http, speech_wav):
    """Per-request engine flags: only ones touching neither files nor the network; a refused or
    unknown flag is a 400 naming it; an allowed one reaches whisper-server's command line."""
    for args, flag in (("--convert", "--convert"), ("-vm /etc/passwd", "-vm"), ("--public /", "--public"),
                       ("-m other.bin", "-m"), ("--bogus 1", "--bogus")):
        resp = http.post("/v1/load", json={"model_name": MODEL, "whispercpp_args": args})
        assert resp.status_code == 400, (args, resp.text)
        assert f"'{flag}'" in resp.json()["error"]["message"]
    ok = http.post("/v1/load", json={"model_name": MODEL, "whispercpp_args": "-nf -t 1"})
    assert ok.status_code == 200, ok.text
    model = loaded(http)[MODEL]
    argv = model["launch_command"]
    assert Path(argv[0]).name == "whisper-server"
    assert argv[argv.index("-m") + 1].endswith(FILE_NAME)
    assert argv[-3:] == ["-nf", "-t", "1"]  # the user's flags last
    assert model["recipe_options"]["whispercpp_args"] == "-nf -t 1"
    assert transcribe(http, speech_wav).status_code == 200


def test_server_wide_args_are_the_admins(http):
    """`whispercpp.args` in the config may use flags a request may not, but never Lemonade's own
    nor ones whisper-server does not know; it is merged into every load's command line."""
    for args, flag in (("--port 9", "--port"), ("--bogus", "--bogus")):
        resp = http.post("/internal/set", json={"whispercpp": {"args": args}})
        assert resp.status_code == 400 and f"'{flag}'" in resp.json()["error"]["message"], resp.text
    try:
        assert http.post("/internal/set", json={"whispercpp": {"args": "-bs 2"}}).status_code == 200
        assert http.post("/v1/load", json={"model_name": MODEL}).status_code == 200
        argv = loaded(http)[MODEL]["launch_command"]
        assert argv[argv.index("-bs") + 1] == "2"
    finally:
        http.post("/internal/set", json={"whispercpp": {"args": ""}})


def test_unload_frees_the_process(http, speech_wav):
    assert transcribe(http, speech_wav).status_code == 200
    pid = loaded(http)[MODEL]["pid"]
    proc = psutil.Process(pid)
    assert "whisper-server" in proc.name() or "whisper-server" in " ".join(proc.cmdline())
    assert http.post("/v1/unload", json={"model_name": MODEL}).status_code == 200
    assert MODEL not in loaded(http)
    try:
        proc.wait(10)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(pid) or proc.status() == psutil.STATUS_ZOMBIE


def test_first_load_installs_the_backend_with_progress(make_server, hub_server, whispercpp_backend):
    """A cache without whisper.cpp: the first load installs it (a real CMake build of the pinned
    sources) and streams the install's progress before the model loads.

    The cache lives under the test cache so that ccache (CCACHE_BASEDIR there, as .ci/run sets it)
    recognises the build of the backend fixture and the compile is quick; the sdist is the one the
    fixture downloaded when it is there."""
    publish_ggml(hub_server)
    cache = Path(tempfile.mkdtemp(prefix="whispercpp-first-load-", dir=TEST_CACHE))
    env = {**hub_server.env(), "CCACHE_BASEDIR": os.environ.get("CCACHE_BASEDIR", str(TEST_CACHE))}
    sdist = TEST_CACHE / "backends" / "whispercpp" / "_downloads" / "pywhispercpp-1.5.1.tar.gz"
    if sdist.is_file():
        env["LEMONADE_WHISPERCPP_SDIST"] = str(sdist)
    srv = None
    try:
        srv = make_server(env=env, cache=cache, engines=())
        with srv.client(timeout=1200) as c:
            state = c.get("/v1/system-info").json()["recipes"]["whispercpp"]["backends"]["cpu"]["state"]
            assert state == "installable"
            events: list[tuple[str, dict]] = []
            with c.stream("POST", "/v1/load", json={"model_name": MODEL, "stream": True}) as resp:
                assert resp.status_code == 200
                event = ""
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        events.append((event, json.loads(line[5:])))
            assert events[-1][0] == "complete", events[-5:]
            phases = {data.get("phase") for name, data in events if name == "progress"}
            assert {"configure", "build"} <= phases, phases
            percents = [d["percent"] for n, d in events if n == "progress" and d.get("phase") == "build"
                        and d.get("percent") is not None]
            assert percents and percents == sorted(percents)  # forward progress only
            info = c.get("/v1/system-info").json()["recipes"]["whispercpp"]["backends"]["cpu"]
            assert info["state"] == "installed"
            assert MODEL in loaded(c)
        installed = json.loads((cache / "backends" / "whispercpp" / "cpu" / "install.json").read_text())
        assert installed["version"] == WHISPER_CPP_VERSION and installed["source"] == "source-build"
        assert not list((cache / "backends" / "whispercpp").glob(".cpu.tmp-*"))
    finally:
        if srv is not None:  # stopped here (not by the fixture) because its cache dir goes away now
            srv.stop()
            make_server.servers.remove(srv)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(cache.with_name(cache.name + "-config"), ignore_errors=True)  # the server's config dir


def test_cpu_bin_your_own_whisper_server_a_tag_and_back(make_server, hub_server, whispercpp_backend, speech_wav,
                                                        tmp_path):
    """`whispercpp.cpu_bin` (guide-configuration-README.md, "Backend binary selection"): a folder with
    your own build serves and is never removed; a release tag cannot be had on Linux (whisper.cpp
    publishes Windows archives only), which the state and the load say, naming the other ways;
    `builtin` is the pinned build again."""
    publish_ggml(hub_server)
    own = tmp_path / "whisper.cpp" / "build" / "bin"
    own.mkdir(parents=True)
    shutil.copy2(whispercpp_backend / "whisper-server", own / "whisper-server")
    srv = make_server(env=hub_server.env(), engines=("whispercpp",), config={"whispercpp": {"cpu_bin": str(own)}})
    with srv.client() as c:
        cpu = c.get("/v1/system-info").json()["recipes"]["whispercpp"]["backends"]["cpu"]
        assert cpu["state"] == "installed" and str(own) in cpu["message"], cpu
        assert transcribe(c, speech_wav).status_code == 200
        assert loaded(c)[MODEL]["launch_command"][0] == str(own / "whisper-server")
        refused = c.post("/v1/uninstall", json={"recipe": "whispercpp", "backend": "cpu"})
        assert refused.status_code == 400 and "does not remove it" in refused.json()["error"]["message"]
        assert MODEL in loaded(c)  # refused before anything was unloaded

        assert c.post("/internal/set", json={"whispercpp": {"cpu_bin": "v1.8.4"}}).status_code == 200
        cpu = c.get("/v1/system-info").json()["recipes"]["whispercpp"]["backends"]["cpu"]
        assert cpu["state"] == "unsupported" and "no release archive of v1.8.4" in cpu["message"], cpu
        assert "own build" in cpu["message"] and cpu["action"] == "lemonade config set whispercpp.cpu_bin=builtin"
        c.post("/v1/unload", json={"model_name": MODEL})
        resp = c.post("/v1/load", json={"model_name": MODEL})
        assert resp.status_code >= 400 and "no release archive of v1.8.4" in resp.text, resp.text

        assert c.post("/internal/set", json={"whispercpp": {"cpu_bin": "builtin"}}).status_code == 200
        assert transcribe(c, speech_wav).status_code == 200
        assert loaded(c)[MODEL]["launch_command"][0] == str(srv.cache / "backends" / "whispercpp" / "cpu"
                                                             / "whisper-server")
    assert (own / "whisper-server").is_file()
    bad = make_server(env=hub_server.env(), engines=(), config={"whispercpp": {"cpu_bin": "relative/folder"}})
    with bad.client() as c:  # a value config validation refuses is skipped at start, with the reason
        assert c.get("/v1/params").json()["whispercpp"]["cpu_bin"] == "builtin"
    assert "whispercpp.cpu_bin" in bad.log()
