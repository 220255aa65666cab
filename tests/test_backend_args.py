"""How a model and its options become a llama-server command line (pure function, no process)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lemonade.backends.llamacpp.engine import build_argv
from lemonade.backends.llamacpp.flags import (
    LEGACY_LOAD_MODE,
    SAFE_FLAGS,
    check_llamacpp_args,
    installed_flags,
    place_slot_folders,
    translate_legacy_flags,
    unknown_flags,
)
from lemonade.backends.llamacpp.spec import NGRAM_ARGS
from lemonade.model_info import ModelInfo
from tests.gguf_factory import write_gguf


def argv_for(tmp_path: Path, mode: str = "chat", *, template: str | None = None, mmproj: bool = False,
             labels: list[str] | None = None, args: str = "", ctx: int = -1, backend: str = "cpu",
             device: str = "") -> list[str]:
    main = write_gguf(tmp_path / "m.gguf", "gemma3" if mode == "chat" else "bert", context_length=4096,
                      pooling_type={"chat": None, "embeddings": 1, "reranking": 4}[mode], chat_template=template)
    files = {"main": [main]}
    if mmproj:
        files["mmproj"] = [write_gguf(tmp_path / "mmproj.gguf", clip=True)]
    model = ModelInfo(name="user.M", recipe="llamacpp", mode=mode, labels=labels or [])
    options = {"ctx_size": ctx, "llamacpp_args": args, "llamacpp_device": device}
    return build_argv(Path("/bin/llama-server"), model, files, options, 4242, backend)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_chat_model_with_template(tmp_path):
    argv = argv_for(tmp_path, template="{{ messages }}")
    assert "--jinja" in argv and "--chat-template-file" not in argv
    assert flag(argv, "--port") == "4242" and flag(argv, "--host") == "127.0.0.1"
    assert flag(argv, "--ctx-size") == "4096"  # automatic: the trained length (capped)
    assert "--metrics" in argv and flag(argv, "--alias") == "user.M"


def test_base_model_gets_a_fallback_template(tmp_path):
    argv = argv_for(tmp_path)
    template = Path(flag(argv, "--chat-template-file"))
    assert template.name == "gemma.jinja" and template.exists()


@pytest.mark.parametrize("mode,expected", [("embeddings", "--embeddings"), ("reranking", "--reranking")])
def test_mode_flags(tmp_path, mode, expected):
    argv = argv_for(tmp_path, mode)
    assert expected in argv and "--jinja" not in argv


def test_a_chat_model_reads_prompts_one_ubatch_at_a_time(tmp_path):
    assert flag(argv_for(tmp_path), "-b") == "512"  # llama-server's own default -ub
    assert flag(argv_for(tmp_path, args="-ub 128"), "-b") == "128"
    own = argv_for(tmp_path, args="-b 2048")
    assert own[-2:] == ["-b", "2048"]  # the user's comes last, and llama-server takes the last
    assert "-b" not in argv_for(tmp_path, "embeddings")  # an embedding takes its whole input in one batch


def test_mmproj_ctx_and_user_args_last(tmp_path):
    argv = argv_for(tmp_path, mmproj=True, ctx=1024, args="--threads 3 -np 2")
    assert flag(argv, "--mmproj").endswith("mmproj.gguf")
    assert flag(argv, "--ctx-size") == "1024"
    assert argv[-4:] == ["--threads", "3", "-np", "2"]


def test_mtp_label_runs_mtp_without_draft_length_defaults(tmp_path):
    """As upstream since 7715e9e92: `--spec-type draft-mtp` alone; the user's own type wins."""
    argv = argv_for(tmp_path, labels=["mtp"])
    assert flag(argv, "--spec-type") == "draft-mtp"
    assert "--spec-draft-n-max" not in argv and "--spec-draft-p-min" not in argv
    argv = argv_for(tmp_path, labels=["mtp"], args="--spec-type none")
    assert argv.count("--spec-type") == 1 and argv[-2:] == ["--spec-type", "none"]


def test_draft_checkpoint_is_the_draft_model(tmp_path):
    """A `draft` file (Gemma 4's MTP assistant) runs as --model-draft with draft-mtp; a DFlash drafter
    (`dflash-*.gguf`) only with the `dflash` label, which selects DFlash decoding; any other draft model
    as draft-simple (llama-server b11312 loads a --model-draft without a --spec-type and never uses it)."""
    main = write_gguf(tmp_path / "m.gguf", "gemma4", chat_template="{{ messages }}")
    mtp_draft = write_gguf(tmp_path / "mtp-gemma-4-12b-it.gguf", "gemma4-assistant")
    dflash = write_gguf(tmp_path / "dflash-kquant.gguf", "dflash")
    small = write_gguf(tmp_path / "gemma-3-270m-it.gguf", "gemma3")

    def argv(draft: Path, labels: list[str], args: str = "") -> list[str]:
        model = ModelInfo(name="builtin.M", recipe="llamacpp", mode="chat", labels=labels)
        return build_argv(Path("/bin/llama-server"), model, {"main": [main], "draft": [draft]},
                          {"llamacpp_args": args}, 4242, "cpu")

    gemma = argv(mtp_draft, ["chat", "mtp"])
    assert flag(gemma, "--model-draft") == str(mtp_draft) and flag(gemma, "--spec-type") == "draft-mtp"
    glimmer = argv(dflash, ["chat", "dflash"])
    assert flag(glimmer, "--model-draft") == str(dflash) and flag(glimmer, "--spec-type") == "draft-dflash"
    unlabelled = argv(dflash, ["chat"])  # the drafter is not used: the draftless n-gram kind instead
    assert "--model-draft" not in unlabelled and flag(unlabelled, "--spec-type") == NGRAM_ARGS[1]
    plain = argv(small, ["chat"])
    assert flag(plain, "--model-draft") == str(small) and flag(plain, "--spec-type") == "draft-simple"
    own = argv(small, ["chat"], "--spec-type draft-simple --spec-draft-n-max 8")
    assert flag(own, "--model-draft") == str(small) and own.count("--spec-type") == 1
    assert "--model-draft" not in argv(dflash, ["chat", "dflash"], "--spec-type none")


def test_speculation_option_and_verdict(tmp_path):
    """`speculation`: off starts no speculative decoding (and loads no draft model); on always does;
    auto follows the controller's verdict (`speculate`). Embedding and reranking models never do."""
    main = write_gguf(tmp_path / "m.gguf", "gemma3", chat_template="{{ messages }}")
    draft = write_gguf(tmp_path / "gemma-3-270m-it.gguf", "gemma3")

    def argv(mode: str, speculate: bool, model_mode: str = "chat", files: dict | None = None) -> list[str]:
        model = ModelInfo(name="user.M", recipe="llamacpp", mode=model_mode, labels=[])
        return build_argv(Path("/bin/llama-server"), model, files or {"main": [main]},
                          {"speculation": mode}, 4242, "cpu", speculate=speculate)

    assert argv("auto", True)[-len(NGRAM_ARGS):] == NGRAM_ARGS
    for off in (argv("off", True), argv("auto", False), argv("off", True, files={"main": [main], "draft": [draft]})):
        assert "--spec-type" not in off and "--model-draft" not in off
    assert flag(argv("on", False), "--spec-type") == NGRAM_ARGS[1]
    assert "--spec-type" not in argv("on", True, "embeddings") and "--spec-type" not in argv("auto", True, "reranking")


@pytest.mark.parametrize("bad", ["-m x", "--port 1", "--ctx-size 5", "--jinja", "--mmproj a",
                                 "--embeddings", "--reranking", "--model=x", "-md d.gguf"])
def test_forbidden_user_args(tmp_path, bad):
    with pytest.raises(ValueError) as err:
        argv_for(tmp_path, args=bad)
    assert bad.split()[0].split("=")[0] in str(err.value)


def test_gpu_layers_and_device_follow_the_backend(tmp_path, caplog):
    gpu = argv_for(tmp_path, backend="vulkan", device="Vulkan1")
    assert flag(gpu, "-ngl") == "99" and flag(gpu, "--device") == "Vulkan1"
    assert "--device" not in argv_for(tmp_path, backend="rocm") and "-ngl" in argv_for(tmp_path, backend="rocm")
    cpu = argv_for(tmp_path, backend="cpu", device="Vulkan1")
    assert flag(cpu, "-ngl") == "0" and "--device" not in cpu  # the cpu backend has no device to choose
    assert "llamacpp_device='Vulkan1' is ignored" in caplog.text
    system = argv_for(tmp_path, backend="system", device="CUDA0")
    assert "-ngl" not in system and flag(system, "--device") == "CUDA0"  # its own defaults, the device asked


def test_slot_folder_is_ours(tmp_path):
    model = ModelInfo(name="user.M", recipe="llamacpp", mode="chat")
    main = write_gguf(tmp_path / "m.gguf", "gemma3", context_length=4096, chat_template="{{ messages }}")
    argv = build_argv(Path("/bin/llama-server"), model, {"main": [main]}, {}, 4242, "cpu", tmp_path / "slots")
    assert flag(argv, "--slot-save-path") == str(tmp_path / "slots")


@pytest.mark.parametrize("args", ["--log-file victim.txt", "--slot-save-path /tmp",
                                  "--lora x.gguf", "--api-key k", "--path /", "--tools all", "-hf a/b",
                                  "--threads 2 --grammar-file g.txt", "--media-path /"])
def test_request_args_cannot_touch_files_or_the_network(args):
    with pytest.raises(ValueError) as err:
        check_llamacpp_args(args)
    assert repr(args.split()[-2] if args.startswith("--threads") else args.split()[0]) in str(err.value)
    assert "llamacpp.args" in str(err.value)  # says where an admin can set it instead


@pytest.mark.parametrize("args", ["--no-mmap", "--mlock", "--no-mmap --mlock", "-ngl 20", "--n-gpu-layers 12",
                                  "--gpu-layers all", "--load-mode mmap+mlock", "-t 2 --no-mmap --flash-attn on",
                                  "--slot-save-path my-chats", "--slot-save-path=team/chats"])
def test_memory_offload_and_confined_slot_flags_are_accepted(args):
    """Flags that only tune memory or offload, and slot saves inside the server's slot folder: the
    spec's own examples (`--no-mmap`, `--mlock`) and partial offload (`-ngl 20`)."""
    assert check_llamacpp_args(args) == args.split()


@pytest.mark.parametrize("path", ["/tmp/x", "../x", "a/../../x", "C:\\x"])
def test_slot_saves_outside_the_slot_folder_are_refused(path):
    with pytest.raises(ValueError, match="inside the server's slot folder"):
        check_llamacpp_args(f"--slot-save-path {path}")
    check_llamacpp_args(f"--slot-save-path {path}", trusted=True)  # the admin's choice


def test_slot_folders_are_placed_under_the_servers(tmp_path):
    argv = place_slot_folders(["--slot-save-path", "chats", "-t", "2", "--slot-save-path=/admin/saves"], tmp_path)
    assert argv == ["--slot-save-path", str(tmp_path / "chats"), "-t", "2", "--slot-save-path=/admin/saves"]
    assert (tmp_path / "chats").is_dir()


def test_documented_spellings_are_translated_for_a_build_that_renamed_them():
    new = frozenset({"--load-mode", "-t"})
    assert translate_legacy_flags(["-t", "2", "--no-mmap"], new) == ["-t", "2", "--load-mode", "none"]
    assert translate_legacy_flags(["--mlock"], new) == ["--load-mode", "mmap+mlock"]
    assert translate_legacy_flags(["--no-mmap", "--mlock"], new) == ["--load-mode", "mlock"]
    old = frozenset({"--no-mmap", "--mlock", "--load-mode"})
    assert translate_legacy_flags(["--no-mmap"], old) == ["--no-mmap"]  # a build that knows them keeps them
    assert translate_legacy_flags(["--no-mmap"], frozenset()) == ["--no-mmap"]  # unreadable --help: as given


def test_rpc_flag_is_ours():
    """`--rpc` comes from the rpc_workers option (checked for reachability first), never from args."""
    for trusted in (False, True):
        with pytest.raises(ValueError, match="rpc_workers"):
            check_llamacpp_args("--rpc 10.0.0.1:50052", trusted=trusted)


def test_safe_args_pass_and_the_admin_may_use_others():
    assert check_llamacpp_args("--threads 2 -np 2 --temp 0.5 -ctk q8_0 --spec-type none") == [
        "--threads", "2", "-np", "2", "--temp", "0.5", "-ctk", "q8_0", "--spec-type", "none"]
    assert check_llamacpp_args("--log-file /var/log/llama.txt", trusted=True)[0] == "--log-file"
    with pytest.raises(ValueError, match="Lemonade sets -m itself"):
        check_llamacpp_args("-m other.gguf", trusted=True)


def test_allow_list_is_known_to_the_pinned_llama_server(llama_backend):
    binary = llama_backend / "llama-server"
    known = installed_flags(binary)
    assert "--threads" in known and "-kvo" in known and "--no-kv-offload" in known  # aliases on one help line
    assert sorted(SAFE_FLAGS - known - set(LEGACY_LOAD_MODE)) == []  # the documented spellings are translated
    assert unknown_flags(["--no-mmap", "--threads", "2", "-1"], binary) == ["--no-mmap"]
    assert unknown_flags(translate_legacy_flags(["--no-mmap", "--mlock"], known), binary) == []


def test_llama_servers_own_fitting_is_off_where_the_layout_is_ours(tmp_path, llama_backend):
    """The cpu backend's context and placement are this server's: llama-server's `--fit` would only
    measure them again at every load; a GPU backend keeps it (it fits layers to the device)."""
    main = write_gguf(tmp_path / "m.gguf", "gemma3", context_length=4096)
    binary = llama_backend / "llama-server"
    for mode in ("chat", "embeddings"):
        model = ModelInfo(name="user.M", recipe="llamacpp", mode=mode)
        assert flag(build_argv(binary, model, {"main": [main]}, {}, 4242, "cpu"), "--fit") == "off"
        assert "--fit" not in build_argv(binary, model, {"main": [main]}, {}, 4242, "vulkan")
    model = ModelInfo(name="user.M", recipe="llamacpp", mode="chat")
    assert "--fit" not in build_argv(tmp_path / "no-such-llama-server", model, {"main": [main]}, {}, 4242, "cpu")
    argv = build_argv(binary, model, {"main": [main]}, {"llamacpp_args": "--fit on"}, 4242, "cpu")
    last = len(argv) - 1 - argv[::-1].index("--fit")
    assert argv.index("--fit") < last and argv[last + 1] == "on"  # the user's own comes later and wins


def test_a_file_without_the_gguf_magic_is_never_started(tmp_path):
    from lemonade.backends.base import BackendStartError
    from lemonade.backends.llamacpp.engine import refuse_damaged_files

    model = ModelInfo(name="user.M", recipe="llamacpp", mode="chat")
    good = write_gguf(tmp_path / "good.gguf", "gemma3", context_length=4096)
    refuse_damaged_files(model, {"main": [good]})
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\0\0\0\0" + good.read_bytes()[4:])
    with pytest.raises(BackendStartError, match="lemonade pull user.M"):
        refuse_damaged_files(model, {"main": [good], "mmproj": [bad]})


@pytest.mark.parametrize(("body", "streamed"), [
    ({"max_tokens": 1}, False), ({"max_tokens": 16}, False), ({"max_completion_tokens": 8}, False),
    ({"max_tokens": 17}, True), ({}, True), ({"max_tokens": -1}, True), ({"n_predict": 500}, True),
    ({"max_tokens": 500, "stream": True}, False),  # already a stream: relayed as it is
])
def test_only_generations_that_may_run_long_are_asked_as_streams(body, streamed):
    """A short answer ends before a client could give up on it; it skips the streamed detour."""
    from lemonade.runtime.engine_request import SHORT_ANSWER_TOKENS, may_run_long

    assert SHORT_ANSWER_TOKENS == 16 and may_run_long(body) is streamed


def test_a_busy_cpu_gets_fewer_engine_threads(monkeypatch):
    """llama-server's threads stall each other at every barrier when other work holds the cores (0.7 vs 8.7
    tokens/s measured at load 17 on 2 cores, cpu_share.py): on a busy machine it gets the cores left free."""
    from lemonade.backends.cpu_share import thread_args, threads_for_load

    assert threads_for_load(2, 0.4) is None  # quiet: the engine's default, one thread per core
    assert threads_for_load(2, 1.0) == threads_for_load(2, 17.3) == 1
    assert threads_for_load(16, 1.5) == 14 and threads_for_load(16, 40.0) == 8  # never below half the cores
    assert threads_for_load(1, 5.0) is None  # one core: nothing to take away
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 9.0, 9.0))
    monkeypatch.setattr("psutil.cpu_count", lambda logical=True: 2)
    assert thread_args([], "llama-server") == ["-t", "1"]
    for chosen in (["-t", "2"], ["--threads", "2"], ["--threads=2"], ["-np", "8", "-t", "2"]):
        assert thread_args(chosen, "llama-server") == []  # the user's (or a profile's) count wins
    monkeypatch.setattr("os.getloadavg", lambda: (0.2, 0.5, 0.5))
    assert thread_args([], "llama-server") == []


def test_an_engine_being_stopped_shares_no_cores_with_the_next():
    """In a swap the next engine starts while the evicted one saves and exits (runtime/router/scheduler.py):
    what the evicted one used while it served is not counted as work the new one competes with."""
    from lemonade.backends import cpu_share

    cpu = {100: 0.0, 200: 0.0}  # the server, the engine being evicted
    clock = [0.0]
    own = cpu_share.OwnLoad(read=lambda: (sum(cpu.values()), dict(cpu)), alive=lambda pid: pid in cpu,
                            clock=lambda: clock[0])
    own.sample()
    clock[0] += 5.0
    cpu[200] += 10.0  # both cores until its last answer
    own.sample()
    assert own.others(1.0) == pytest.approx(1.0 - own.smoothed + 2.0)
    own.leaving(200)
    assert own.others(1.0) == pytest.approx(1.0 - own.smoothed)
    own.leaving(None)  # a remote model has no process
    clock[0] += 5.0
    del cpu[200]  # it exited: forgotten at the next sample
    own.sample()
    assert own.others(1.0) == pytest.approx(1.0 - own.smoothed)


def test_load_our_own_unloaded_engine_left_does_not_take_threads(monkeypatch):
    """Right after a swap the load average still holds a minute of the unloaded engine's work; the next
    engine used to start with one thread for it (cpu_share.py). Our processes' share is followed like the
    kernel follows the load: gone processes' share is not counted, running ones' recent use is."""
    from lemonade.backends import cpu_share

    cpu = {100: 0.0, 200: 0.0}  # running pid -> CPU seconds: the server, an engine
    ended = [0.0]  # CPU seconds of ended processes, in the server's children_* once reaped
    clock = [0.0]
    own = cpu_share.OwnLoad(read=lambda: (sum(cpu.values()) + ended[0], dict(cpu)), alive=lambda pid: pid in cpu,
                            clock=lambda: clock[0])
    assert own.others(1.5) == 1.5  # nothing sampled yet: all the load counts
    own.sample()
    for _ in range(12):  # the engine uses both cores for a minute, the server a tenth of one
        clock[0] += 5.0
        cpu[200] += 10.0
        cpu[100] += 0.5
        own.sample()
    assert own.smoothed == pytest.approx(2.1 * (1 - math.exp(-1)), rel=0.01)  # the kernel's mean of 2.1 tasks
    assert own.others(1.5) == pytest.approx(1.5 - own.smoothed + 2.1)  # the engine runs: it takes cores
    ended[0] = cpu.pop(200) + 10.0  # it works 5 s more, then is unloaded before the next sample
    assert own.others(1.5) == pytest.approx(1.5 - own.smoothed + 0.1)
    clock[0] += 1.0
    own.sample(min_span=5.0)  # too soon after the last one: nothing changes
    assert own.smoothed == pytest.approx(2.1 * (1 - math.exp(-1)), rel=0.01)
    clock[0] += 4.0
    cpu[100] += 0.5
    own.sample()  # the engine's last seconds count, though it ended before this sample
    assert own.smoothed == pytest.approx(2.1 * (1 - math.exp(-65 / 60)), rel=0.01)
    monkeypatch.setattr(cpu_share, "OWN_LOAD", own)
    monkeypatch.setattr("psutil.cpu_count", lambda logical=True: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (1.5, 1.0, 0.5))
    assert cpu_share.thread_args([], "llama-server") == []  # the load was ours: both cores
    monkeypatch.setattr("os.getloadavg", lambda: (2.6, 1.5, 0.5))  # and another process uses a core
    assert cpu_share.thread_args([], "llama-server") == ["-t", "1"]
    assert own.last_choice == {"engine": "llama-server", "load_average": 2.6,  # health's last_engine_start
                               "others": round(2.6 - own.smoothed + 0.1, 2), "threads": 1}
