"""Run Lemonade's own integration tests against this server, offline, and count them per file.

    .venv/bin/python scripts/lemonade_tests.py CHECKOUT [FILE ...] [--work DIR] [--keep] [--json OUT]
    .venv/bin/python scripts/lemonade_tests.py CHECKOUT --list

CHECKOUT is a checkout of lemonade-sdk/lemonade (or any folder holding its `test/`): the files
`test/server_*.py` and `test/test_*.py` with `test/utils/`, and `docs/` where one test reads it.
FILE names which of them to run (`server_llm` or `server_llm.py`); none runs every file of `FILES`,
one after the other.

How a file runs (what docs/compatibility.md's count was taken with):

- `test/` is copied into the work dir, with `build/lemonade` and `build/lemond` (where Lemonade's
  tests look for its binaries) as wrappers of this project's `lemonade` and `lemond`. In the copy,
  unittest's `failfast` is turned off, so a file's whole count is taken.
- Each file gets a fresh `lemonade serve` with its own cache and config dirs on a free port
  (`LEMONADE_TEST_PORT`, `LEMONADE_PORT`), the test cache's installed engines linked in as the
  suite's servers have them (tests/helpers.py), and the arguments Lemonade's CI gives that file,
  with the `cpu` backend. A file that starts `lemond` on a cache dir of its own (server_jobs) gets
  the same engines linked into that dir by the wrapper; a backend a test uninstalls and installs
  again is built from source through the test cache's ccache.
- Models come from the local hub (tests/hub) under the checkpoints of the built-in catalog, so the
  server downloads them with the real huggingface_hub: Gemma 3 270M for every LLM, all-MiniLM-L6-v2
  for the embedding models, the suite's random-weight reranker, Whisper (ggml), SD 1.x and
  Real-ESRGAN, Kokoro-82M, a random Gemma 3 vision projector as every `mmproj`, and the built-in
  collections' collection files (`build_hub`). The speech sample Lemonade ships beside its tests is
  put in the test's temp dir, where server_whisper looks before downloading it.
- One harness setting is not a user's: `llamacpp.args = "-n 12"` in the server's config.json.
  Lemonade's tests were written for instruct models that stop after a short reply; base Gemma
  writes until its context is full, and the tests that send no `max_tokens` would time out.

The machine should have what `.ci/run` installs (the engines and test models in the test cache).
Each file's output is kept in the work dir (`<file>.log`, and `<file>.server.log`). The script
prints a line per file and a table at the end; it never asserts anything: what fails is read, and
either fixed in the server or written down in docs/compatibility.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lemonade.checkpoints.variants import is_exact_file_variant, match_variant, parse_checkpoint  # noqa: E402
from lemonade.util.ports import free_port  # noqa: E402
from tests.helpers import TEST_CACHE, answers_live  # noqa: E402

# File -> the arguments Lemonade's CI workflow runs it with (cpu where it names a backend).
FILES: dict[str, list[str]] = {
    "server_endpoints.py": ["--cli-binary", "{cli}"],
    "server_cli2.py": ["--cli-binary", "{cli}"],
    "server_jobs.py": ["--lemond-binary", "{lemond}"],
    "server_telemetry.py": ["--cli-binary", "{cli}"],
    "test_ollama.py": ["--cli-binary", "{cli}"],
    "server_sd.py": ["--wrapped-server", "sd-cpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_llm.py": ["--wrapped-server", "llamacpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_mcp.py": ["--cli-binary", "{cli}"],
    "server_websocket_auth.py": [],
    "server_websocket_telemetry.py": [],
    "server_whisper.py": ["--wrapped-server", "whispercpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_router.py": ["--cli-binary", "{cli}"],
    "server_webapp.py": ["--cli-binary", "{cli}"],
    "server_tts.py": ["--cli-binary", "{cli}"],
    "server_streaming_errors.py": ["--cli-binary", "{cli}"],
    "server_downloads.py": ["--cli-binary", "{cli}"],
    "server_pinning.py": ["--wrapped-server", "llamacpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_eviction.py": ["--wrapped-server", "llamacpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_watchdog_lifecycle.py": ["--wrapped-server", "llamacpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_omni.py": ["--wrapped-server", "llamacpp", "--backend", "cpu", "--cli-binary", "{cli}"],
    "server_cli_apikey.py": ["--cli-binary", "{cli}"],
    "test_model_name_normalization.py": ["--cli-binary", "{cli}"],
    "test_llamacpp_system_backend.py": ["--cli-binary", "{cli}"],
    "test_multi_checkpoint_completeness.py": [],
    "test_websocket_idle.py": [],
}
# Environment some files read: their real-download and "live Hugging Face" checks, on (against the hub).
FILE_ENV: dict[str, dict[str, str]] = {
    "server_downloads.py": {"LEMONADE_RUN_REAL_DOWNLOAD_TESTS": "1", "LEMONADE_RUN_GGUF_MAGIC_TESTS": "1"},
    "server_endpoints.py": {"LEMONADE_INTEGRATION_TESTS": "1"},
}
# Files an API key is given to (they test the key itself): the server and the test both get it.
FILE_KEYS: dict[str, dict[str, str]] = {
    "server_cli_apikey.py": {"LEMONADE_API_KEY": "harness-key"},
}
NOT_RUN: dict[str, str] = {
    "server_gfx_topology.py": "reads Lemonade's own sources (backend_versions.json)",
    "test_schema_lock.py": "checks Lemonade's own sources",
    "test_routing_fixtures.py": "checks Lemonade's own sources",
    "test_comment_slop.py": "checks Lemonade's own sources",
    "test_tray_https.py": "Lemonade's tray app",
    "server_mcp_smoke.py": "drives Claude Code (an MCP client that is not on this machine)",
    "server_3d.py": "no offline stand-in model (TRELLIS, GPU only)",
    "server_audio_generation.py": "no offline stand-in model (ThinkSound, ACE-Step; GPU only)",
    "server_moonshine.py": "no offline stand-in model and no Moonshine engine here",
    "server_thenoise.py": "no offline stand-in model (ROCm only)",
    "server_tts_openmoss.py": "no offline stand-in model (GPU only)",
    "server_classify.py": "no offline stand-in for the phishing classifier's labels",
    "test_flm_status.py": "FastFlowLM is AMD's NPU engine; there is no FLM recipe here",
}
ENGINES = ("llamacpp", "whispercpp", "sd-cpp", "kokoro", "piper", "onnxruntime", "fasterwhisper")
HARNESS_CONFIG = {"llamacpp": {"args": "-n 12"}}  # see the module doc: the one setting that is not a user's
FILE_TIMEOUT = 3 * 3600


# ----- the stand-in models on the hub -----------------------------------------------------------------------

def _stand_ins() -> dict[str, Any]:
    """role -> a callable giving the stand-in file (built once, cached in the test cache)."""
    from tests.ggml_whisper import tiny_random_whisper_ggml
    from tests.helpers import gemma_file
    from tests.models import minilm_gguf, tiny_reranker_gguf
    from tests.sd_factory import tiny_esrgan_model, tiny_sd1_model

    return {"llm": gemma_file, "embeddings": minilm_gguf, "reranking": tiny_reranker_gguf,
            "whisper": tiny_random_whisper_ggml, "image": tiny_sd1_model, "upscaling": tiny_esrgan_model}


def _file_name(repo: str, variant: str | None) -> str:
    """The file a checkpoint names: its file variant as it is, or a GGUF named for its quant tag."""
    if variant and is_exact_file_variant(variant):
        return variant
    stem = re.sub(r"-GGUF$", "", repo.split("/", 1)[1], flags=re.IGNORECASE)
    name = f"{stem}-{variant or 'Q4_K_M'}.gguf"
    assert match_variant([name], variant) == [name], (repo, variant, name)
    return name


def _entry_files(name: str, entry: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(repo, file, stand-in role) for each file a catalog entry downloads that has a stand-in."""
    from lemonade.catalog.catalog import _checkpoints_of

    recipe, labels = entry.get("recipe"), set(entry.get("labels") or [])
    checkpoints = _checkpoints_of(name, entry)
    out = []
    for role, text in checkpoints.items():
        checkpoint = parse_checkpoint(text)
        repo, variant = checkpoint.repo, checkpoint.variant
        if recipe == "llamacpp" and role in ("main", "draft"):
            kind = "embeddings" if "embeddings" in labels else "reranking" if "reranking" in labels else "llm"
            out.append((repo, _file_name(repo, variant), kind))
        elif recipe == "llamacpp" and role == "mmproj" and variant:
            out.append((repo, variant, "mmproj"))
        elif recipe == "whispercpp" and role == "main" and variant:
            out.append((repo, variant, "whisper"))
        elif recipe == "sd-cpp" and role == "main" and variant and len(checkpoints) == 1:
            out.append((repo, variant, "upscaling" if "upscaling" in labels else "image"))
    return out


# Checkpoints Lemonade's tests pull that the catalog does not name (user models, jobs).
EXTRA_FILES = [
    ("unsloth/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct-Q2_K.gguf", "llm"),
    ("unsloth/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct-Q4_K_M.gguf", "llm"),
    ("mradermacher/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q2_K.gguf", "llm"),
    ("bartowski/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct-Q2_K.gguf", "llm"),
    ("ggml-org/tiny-llamas", "stories15M-q4_0.gguf", "llm"),
    ("Comfy-Org/z_image", "split_files/vae/ae.safetensors", "upscaling"),  # only downloaded, never run
    # server_endpoints' "live Hugging Face" checks of /pull/variants, asked of the local hub instead
    ("TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF", "tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf", "llm"),
    ("TheBloke/TinyLlama-1.1B-Chat-v1.0-GGUF", "tinyllama-1.1b-chat-v1.0.Q8_0.gguf", "llm"),
]


def build_hub(root: Path) -> int:
    """Lay out the stand-in repos under `root` (hard links where it can); the number of files."""
    from lemonade.catalog.catalog import _builtin_definitions
    from tests.speech import kokoro_repo_files
    from tests.vision_projector import write_vision_projector

    makers = _stand_ins()
    sources: dict[str, Path] = {}
    files = [f for name, entry in _builtin_definitions().items() for f in _entry_files(name, entry)] + EXTRA_FILES
    for repo, name, role in files:
        target = root / repo / name
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if role == "mmproj":
            write_vision_projector(target)
            continue
        source = sources.setdefault(role, Path(makers[role]()))
        try:
            os.link(source, target)
        except OSError:  # another filesystem
            shutil.copyfile(source, target)
    # Built-in collections name a repository holding their collection file (catalog/collection_file.py);
    # the stand-in file lists the components the catalog gives inline.
    for name, entry in _builtin_definitions().items():
        if entry.get("recipe", "").startswith("collection.") and entry.get("checkpoint") and entry.get("components"):
            repo = entry["checkpoint"]
            target = root / repo / f"{repo.rsplit('/', 1)[-1]}.json"
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps({"model_name": name, "recipe": entry["recipe"],
                                              "components": entry["components"], "models": [],
                                              "size": entry.get("size")}))
                files.append((repo, target.name, "collection"))
    kokoro = root / "mikkoph" / "kokoro-onnx"
    if not (kokoro / "index.json").exists():
        kokoro.mkdir(parents=True, exist_ok=True)
        for name, data in kokoro_repo_files().items():
            if isinstance(data, Path):
                os.link(data, kokoro / name)
            else:
                (kokoro / name).write_bytes(data)
        files.append(("mikkoph/kokoro-onnx", "*", "kokoro"))
    return len(files)


# ----- one file ---------------------------------------------------------------------------------------------

@dataclass
class Result:
    file: str
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    ran: int = 0
    exit_code: int | None = None
    seconds: float = 0.0
    note: str = ""

    def line(self) -> str:
        return (f"{self.file}: {self.passed} passed of {self.passed + len(self.failed)} run"
                f"{f', {len(self.skipped)} skipped' if self.skipped else ''}"
                f"{' (failed: ' + ', '.join(self.failed) + ')' if self.failed else ''}"
                f" [{self.seconds:.0f} s{', ' + self.note if self.note else ''}]")


def parse_outcomes(text: str) -> tuple[int, list[str], list[str]]:
    """(passed count, failed test names, skipped test names) from unittest's output: the counts from
    its closing lines (`Ran N tests`, `FAILED (failures=a, errors=b, skipped=c)`), the names from its
    `FAIL: name (...)` / `ERROR: name (...)` reports and the verbose `skipped '...'` outcomes (a test's
    own prints may stand between its name and its outcome, so a skip goes to the last name before it)."""
    ran = sum(int(n) for n in re.findall(r"^Ran (\d+) tests?", text, re.MULTILINE))
    counts = {k: 0 for k in ("failures", "errors", "skipped")}
    for status in re.findall(r"^(?:OK|FAILED) \((.*)\)\s*$", text, re.MULTILINE):
        for key, value in re.findall(r"(\w+)=(\d+)", status):
            if key in counts:
                counts[key] += int(value)
    failed = [m.group(1) for m in re.finditer(r"^(?:FAIL|ERROR): (\w+) \(", text, re.MULTILINE)]
    names = [(m.start(), m.group(1)) for m in re.finditer(r"^(test\w*) \([\w.]+\)", text, re.MULTILINE)]
    skipped = []
    for m in re.finditer(r"(?:\.\.\. ?|^)skipped ['\"]", text, re.MULTILINE):
        before = [n for pos, n in names if pos <= m.start()]
        if before:
            skipped.append(before[-1])
    passed = ran - counts["failures"] - counts["errors"] - counts["skipped"]
    return max(passed, 0), failed, skipped


def prepare_checkout(source: Path, work: Path) -> Path:
    """A copy of `source`'s test/ with build/lemonade and build/lemond wrappers; failfast off."""
    test_dir = source / "test" if (source / "test").is_dir() else source
    if not (test_dir / "utils" / "server_base.py").is_file():
        raise SystemExit(f"{source}: no Lemonade test/ folder (test/utils/server_base.py) there")
    checkout = work / "checkout"
    shutil.rmtree(checkout, ignore_errors=True)
    shutil.copytree(test_dir, checkout / "test")
    if (test_dir.parent / "docs").is_dir():  # server_cli2 checks its help text against docs/guide/cli.md
        shutil.copytree(test_dir.parent / "docs", checkout / "docs")
    for path in (checkout / "test").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "failfast=True" in text:
            path.write_text(text.replace("failfast=True", "failfast=False"), encoding="utf-8")
    build = checkout / "build"
    build.mkdir()
    bin_dir = Path(sys.executable).parent
    (build / "lemonade").write_text(f'#!/bin/sh\nexec "{bin_dir / "lemonade"}" "$@"\n')
    # Some files start lemond on a cache dir of their own (`lemond DIR --port N`): it gets the test
    # cache's installed engines linked in, as the harness's own server has them, ...
    links = "".join(f'  [ -d "{TEST_CACHE}/backends/{r}/cpu" ] && [ ! -e "$1/backends/{r}/cpu" ] && '
                    f'mkdir -p "$1/backends/{r}" && ln -s "{TEST_CACHE}/backends/{r}/cpu" "$1/backends/{r}/cpu"\n'
                    for r in ENGINES)
    # ... and the harness's config (the `-n 12` cap) where the test writes none of its own.
    config = json.dumps(HARNESS_CONFIG)
    first_arg_is_a_dir = ('if [ -n "$1" ] && [ "${1#-}" = "$1" ]; then\n  mkdir -p "$1"\n'
                          f'  [ -e "$1/config.json" ] || echo \'{config}\' > "$1/config.json"\n')
    (build / "lemond").write_text(f'#!/bin/sh\n{first_arg_is_a_dir}{links}fi\nexec "{bin_dir / "lemond"}" "$@"\n')
    for name in ("lemonade", "lemond"):
        (build / name).chmod(0o755)
    return checkout


def start_hub(root: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = work / "hub.json"
    ready.unlink(missing_ok=True)
    log = open(work / "hub.log", "ab")  # noqa: SIM115 - the hub runs for the whole run
    proc = subprocess.Popen([sys.executable, "-m", "tests.hub.server", "--root", str(root), "--port", "0",
                             "--ready-file", str(ready)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the local hub did not start; see {work / 'hub.log'}")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())["url"]


def file_env(cache: Path, port: int, hub_url: str, extra: dict[str, str]) -> dict[str, str]:
    """What the server and the test process share: this file's dirs, the port, the hub, and the test
    cache's compiler cache for a backend that a test uninstalls and installs again (the source
    build then takes seconds, not minutes: paths are made relative to the work dir, which is laid
    out as the test cache, so the suite's entries match; .ci/run does the same)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEMONADE_", "HF_"))}
    env.update({"CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
                "CCACHE_DIR": str(TEST_CACHE / "ccache"), "CCACHE_BASEDIR": str(cache.parent),
                "CCACHE_MAXSIZE": "2G"})
    env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(cache.with_name(cache.name + "-config")),
                "HF_HOME": str(cache / "hf"), "HF_ENDPOINT": hub_url, "MODELSCOPE_ENDPOINT": hub_url,
                "HF_HUB_DISABLE_TELEMETRY": "1", "LEMONADE_TEST_PORT": str(port), "LEMONADE_PORT": str(port),
                "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8", **extra})
    return env


def run_file(name: str, checkout: Path, work: Path, hub_url: str, keep: bool) -> Result:
    result = Result(name)
    stem = name.removesuffix(".py")
    cache = work / "runs" / stem
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(cache.with_name(stem + "-config"), ignore_errors=True)
    for recipe in ENGINES:  # the test cache's installed engines, linked in as the suite does
        installed = TEST_CACHE / "backends" / recipe / "cpu"
        if installed.exists():
            link = cache / "backends" / recipe / "cpu"
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(installed, target_is_directory=True)
    config_dir = cache.with_name(stem + "-config")
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps(HARNESS_CONFIG))
    # The test's own temp dir, holding the speech sample Lemonade ships beside its tests (server_whisper
    # looks for it there before it would download the same file from GitHub).
    tmp = work / "tmp" / stem
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if (checkout / "test" / "test_speech.wav").is_file():
        shutil.copyfile(checkout / "test" / "test_speech.wav", tmp / "test_speech.wav")
    port = free_port()
    env = file_env(cache, port, hub_url, {**FILE_ENV.get(name, {}), **FILE_KEYS.get(name, {}), "TMPDIR": str(tmp)})
    server_log = open(work / f"{stem}.server.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "lemonade.cli.main", "serve", "--port", str(port)],
                              env=env, stdout=server_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 120
        while not answers_live(port):
            if server.poll() is not None or time.monotonic() > deadline:
                result.note = "server did not start"
                return result
            time.sleep(0.1)
        args = [a.format(cli=checkout / "build" / "lemonade", lemond=checkout / "build" / "lemond")
                for a in FILES[name]]
        with open(work / f"{stem}.log", "w", encoding="utf-8") as log:
            try:
                proc = subprocess.run([sys.executable, f"test/{name}", *args], cwd=checkout, env=env,
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      timeout=FILE_TIMEOUT)
                result.exit_code = proc.returncode
            except subprocess.TimeoutExpired:
                result.note = f"stopped after {FILE_TIMEOUT} s"
        text = (work / f"{stem}.log").read_text(encoding="utf-8", errors="replace")
        result.passed, result.failed, result.skipped = parse_outcomes(text)
        result.ran = result.passed + len(result.failed)
        if not re.search(r"^Ran \d+ tests?", text, re.MULTILINE):  # not unittest: its exit code counts
            result.passed, result.failed = (1, []) if result.exit_code == 0 else (0, [name])
            result.ran = 1
    finally:
        result.seconds = time.monotonic() - started
        stop(server)
        server_log.close()
        if not keep:
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(config_dir, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def stop(proc: subprocess.Popen[bytes]) -> None:
    """The process and everything it started (engines, a backend build in a session of its own), by
    pid: its descendants are listed before it is asked to stop, and whatever outlives it is killed."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a checkout of lemonade-sdk/lemonade (or its test/ folder)")
    parser.add_argument("files", nargs="*", help="files to run (default: every file this harness runs)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lemonade-upstream-tests"),
                        help="work dir: the copied tests, the hub's repos, logs (kept between runs)")
    parser.add_argument("--keep", action="store_true", help="keep each file's cache dir")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--list", action="store_true", help="list the files and those not run, with why")
    args = parser.parse_args(argv)
    if args.list:
        for name in FILES:
            print(f"run      {name} {' '.join(FILES[name])}")
        for name, why in NOT_RUN.items():
            print(f"not run  {name}: {why}")
        return 0
    names = [n if n.endswith(".py") else n + ".py" for n in args.files] or list(FILES)
    unknown = [n for n in names if n not in FILES]
    if unknown:
        raise SystemExit(f"not a file this harness runs: {', '.join(unknown)} "
                         f"({'; '.join(f'{n}: {NOT_RUN[n]}' for n in unknown if n in NOT_RUN) or 'see --list'})")
    work = args.work.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops what it started
    work.mkdir(parents=True, exist_ok=True)
    checkout = prepare_checkout(args.checkout.resolve(), work)
    print(f"stand-in repos: {build_hub(work / 'hub')} files under {work / 'hub'}", flush=True)
    hub, hub_url = start_hub(work / "hub", work)
    results: list[Result] = []
    try:
        for name in names:
            print(f"running {name} ...", flush=True)
            results.append(run_file(name, checkout, work, hub_url, args.keep))
            print("  " + results[-1].line(), flush=True)
            if args.json:
                args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    finally:
        stop(hub)
    print("\n| file | passed | failed | skipped | tests |\n|---|---|---|---|---|")
    for r in results:
        total = r.passed + len(r.failed) + len(r.skipped)
        print(f"| {r.file} | {r.passed} | {len(r.failed)} | {len(r.skipped)} | {total} |")
    passed, failed, skipped = (sum(r.passed for r in results), sum(len(r.failed) for r in results),
                               sum(len(r.skipped) for r in results))
    print(f"| total | {passed} | {failed} | {skipped} | {passed + failed + skipped} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
