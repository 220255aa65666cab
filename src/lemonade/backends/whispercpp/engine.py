"""The whisper.cpp engine: `whisper-server` per loaded model, for the `whispercpp` recipe (`Whisper-*`).

Installation is `backends/whispercpp/install.py` (release archive where upstream publishes one, else a
static build of the pinned whisper.cpp that the `pywhispercpp` sdist vendors), flags are
`backends/whispercpp/flags.py`. This module describes the engine and speaks whisper-server's language:
our transcription request (audio bytes, fields in the query string) becomes a multipart POST to
its `/inference` with `response_format=verbose_json`, and its answer becomes the engine-neutral
`{"text", "language", "duration", "segments": [{"id", "start", "end", "text", ...}]}` that
`api/openai/audio.py` shapes into json/verbose_json/text/srt/vtt.

Models are ggml files (`ggml-tiny.bin`, ...), e.g. the catalog's `ggerganov/whisper.cpp:ggml-tiny.bin`.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from lemonade.backends.base import BackendStartError, WrappedServer
from lemonade.backends.engine import (
    Engine,
    EngineUnavailable,
    Launch,
    install_action,
)
from lemonade.backends.native_engine import NativeBackends
from lemonade.backends.whispercpp.flags import check_whispercpp_args
from lemonade.backends.whispercpp.install import EXE, WHISPER_CPP_VERSION, WhisperCppInstall
from lemonade.errors import APIError

if TYPE_CHECKING:
    from lemonade.config import Config
    from lemonade.model_info import ModelInfo

INFERENCE_PATH = "/inference"
GGML_MAGIC = b"lmgg"  # 0x67676d6c, little-endian: the first 4 bytes of a whisper.cpp model file

# whisper.cpp's languages (`g_lang` in src/whisper.cpp): code=name. Requests name the code; the
# server's verbose_json names the language in full, which we turn back into the code.
_LANGUAGE_TABLE = """
en=english zh=chinese de=german es=spanish ru=russian ko=korean fr=french ja=japanese pt=portuguese
tr=turkish pl=polish ca=catalan nl=dutch ar=arabic sv=swedish it=italian id=indonesian hi=hindi fi=finnish
vi=vietnamese he=hebrew uk=ukrainian el=greek ms=malay cs=czech ro=romanian da=danish hu=hungarian ta=tamil
no=norwegian th=thai ur=urdu hr=croatian bg=bulgarian lt=lithuanian la=latin mi=maori ml=malayalam cy=welsh
sk=slovak te=telugu fa=persian lv=latvian bn=bengali sr=serbian az=azerbaijani sl=slovenian kn=kannada
et=estonian mk=macedonian br=breton eu=basque is=icelandic hy=armenian ne=nepali mn=mongolian bs=bosnian
kk=kazakh sq=albanian sw=swahili gl=galician mr=marathi pa=punjabi si=sinhala km=khmer sn=shona yo=yoruba
so=somali af=afrikaans oc=occitan ka=georgian be=belarusian tg=tajik sd=sindhi gu=gujarati am=amharic
yi=yiddish lo=lao uz=uzbek fo=faroese ht=haitian_creole ps=pashto tk=turkmen nn=nynorsk mt=maltese
sa=sanskrit lb=luxembourgish my=myanmar bo=tibetan tl=tagalog mg=malagasy as=assamese tt=tatar haw=hawaiian
ln=lingala ha=hausa ba=bashkir jw=javanese su=sundanese yue=cantonese
"""
LANGUAGES: dict[str, str] = dict(pair.split("=") for pair in _LANGUAGE_TABLE.split())
LANGUAGE_CODES = {name.replace("_", " "): code for code, name in LANGUAGES.items()}


def _unsupported_message(backend: str) -> str:
    return ("Requires Windows and an AMD Ryzen AI NPU; this build of Lemonade runs whisper.cpp on the CPU or a "
            "Vulkan GPU (whispercpp:cpu, whispercpp:vulkan).")


def model_file(model: ModelInfo, files: dict[str, list[Path]]) -> Path:
    """The ggml model file; a file that is not one is never handed to whisper-server."""
    paths = files.get("main") or []
    if not paths:
        raise EngineUnavailable(f"Model {model.public} has no model file.", code="model_load_error")
    path = paths[0]
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise BackendStartError(f"Cannot read {path.name} of {model.public}: {exc}") from None
    if magic != GGML_MAGIC:
        raise BackendStartError(f"{path.name} of {model.public} is not a whisper.cpp ggml model (it starts with "
                                f"{magic!r}). A whispercpp model is one ggml-*.bin file, e.g. the checkpoint "
                                f"'ggerganov/whisper.cpp:ggml-tiny.bin'; if the download is damaged, run "
                                f"`lemonade pull {model.public}`.")
    return path


def multipart_frame(fields: dict[str, str], filename: str = "audio") -> tuple[bytes, bytes, str]:
    """The framing of a multipart/form-data body whose last part, `file`, is the audio: (what goes
    before the audio, what goes after it, the content type). The boundary is random, so no field
    value can end a part early."""
    boundary = f"lemonade-{uuid.uuid4().hex}"
    head = b"".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
                    for name, value in fields.items())
    head += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
             "Content-Type: application/octet-stream\r\n\r\n").encode()
    return head, f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def transcription_fields(query: str) -> dict[str, str]:
    """Our request's fields (language, prompt, temperature) as whisper-server's form fields; the
    answer is always asked for as verbose_json (segments with timestamps)."""
    fields = {"response_format": "verbose_json"}
    for key, value in parse_qsl(query):
        if key == "language":
            code = value.strip().lower()
            if code not in LANGUAGES and code != "auto":
                raise APIError(400, f"Invalid value for 'language': '{value}'. Use an ISO 639-1 code whisper.cpp "
                                    "knows (e.g. en, de, fr, es, ja, zh), or leave it out to detect the language.",
                               code="invalid_argument")
            fields["language"] = code
        elif key in ("prompt", "temperature"):
            fields[key] = value
    return fields


def transcription_result(content: bytes) -> dict[str, Any]:
    """whisper-server's verbose_json as the engine-neutral transcription result."""
    answer = json.loads(content)
    duration = float(answer.get("duration") or 0.0)
    segments = []
    for i, seg in enumerate(answer.get("segments") or []):
        out = {"id": i, "seek": 0, "start": round(float(seg.get("start", 0.0)), 3),
               "end": round(float(seg.get("end", duration)), 3), "text": seg.get("text", "")}
        for key in ("tokens", "temperature", "avg_logprob", "no_speech_prob"):
            if key in seg:
                out[key] = seg[key]
        segments.append(out)
    language = str(answer.get("language") or "")
    return {"text": "".join(s["text"] for s in segments).strip(), "language": LANGUAGE_CODES.get(language, language),
            "duration": duration, "segments": segments}


class WhisperCppEngine(NativeBackends, Engine):
    # memory rule (Engine.memory_need; measured on this machine, docs/memory.md):
    # the tiny Whisper architecture (74 MiB of ggml weights) peaked at 158 MiB transcribing
    memory_base_bytes = 95 << 20
    memory_per_weight_byte = 1.0
    recipe = "whispercpp"
    release_page = f"https://github.com/ggml-org/whisper.cpp/releases/tag/{WHISPER_CPP_VERSION}"
    options = {
    }
    args_checker = staticmethod(check_whispercpp_args)
    process = "whisper-server"
    endpoints = {"audio/transcriptions": INFERENCE_PATH}
    # whisper-server decodes with miniaudio and stb_vorbis: no WebM, no Ogg Opus (Ogg Vorbis only)
    audio_formats = ("wav", "mp3", "flac", "ogg")

    def __init__(self, cache_dir: Path, config: Config) -> None:
        super().__init__(cache_dir, config)
        self.installer = WhisperCppInstall(self.cache_dir)

    # ----- backends (native_engine.NativeBackends) ----------------------------------------------
    product = "whisper.cpp"
    build_minutes = "3 to 8"

    def unsupported_message(self, backend: str) -> str:
        return _unsupported_message(backend)

    # ----- running a model ---------------------------------------------------------------------------
    async def launch(self, model: ModelInfo, files: dict[str, list[Path]], options: dict[str, Any],
                     backend: str, port: int) -> Launch:
        binary = self.installer_for(backend).binary(EXE, backend)
        if binary is None:
            st = self.state(backend)
            action = st.action or install_action(self.recipe, backend)
            raise EngineUnavailable(f"The whisper.cpp '{backend}' backend is not installed ({st.message}). Install "
                                    f"it with: {action}", action=action)
        path = model_file(model, files)
        try:
            user_args = check_whispercpp_args(options.get("whispercpp_args") or "", trusted=True)
        except ValueError as exc:
            raise EngineUnavailable(str(exc), code="invalid_engine_argument") from None
        # `-l auto`: detect the language unless a request (or the user's args, which come last) names
        # one; whisper-server's own default is English. `-nlp`: verbose_json without the language
        # probabilities, which cost a second language-detection pass per request.
        argv = [str(binary), "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "-l", "auto", "-nlp",
                *user_args]
        server = WrappedServer(f"{self.process}:{model.public}", argv, port, health_path="/health",
                               env=self.engine_env(backend))
        await server.start(self.ready_timeout)
        # `auto` shows as the backend it chose
        return Launch(server, {**options, "whispercpp_backend": backend}, backend, device=self.device(backend))

    # ----- requests ----------------------------------------------------------------------------------
    def encode_raw(self, path: str, content_type: str, launch: Launch | None = None) -> tuple[str, bytes, bytes, str]:
        """A transcription (audio body, fields in the query) as whisper-server's multipart form."""
        url = urlsplit(path)
        if url.path != INFERENCE_PATH:
            return path, b"", b"", content_type
        head, tail, multipart_type = multipart_frame(transcription_fields(url.query))
        return INFERENCE_PATH, head, tail, multipart_type

    def decode_raw(self, path: str, content: bytes) -> bytes:
        if urlsplit(path).path != INFERENCE_PATH:
            return content
        return json.dumps(transcription_result(content)).encode()

    def raw_error(self, path: str, error: APIError) -> APIError:
        """whisper-server answers audio it cannot decode with a bare 400 "Invalid request"."""
        if urlsplit(path).path == INFERENCE_PATH and error.status == 400:
            return APIError(400, "Invalid value for 'file': whisper.cpp could not read it as audio (it reads WAV, "
                                 f"MP3, FLAC and Ogg Vorbis). The engine said: {error.message}",
                            code="invalid_argument")
        return error
