"""Worker hosts for the llama.cpp RPC tests: Linux network namespaces, each with a `lemonade worker`.

A host is a namespace joined to the root namespace by its own veth pair (10.77.N.1 in the root
namespace, 10.77.N.2 inside); its worker is our real CLI, which starts the cached llama.cpp build's
`ggml-rpc-server` bound to the namespace's address only. A host may be put in a memory cgroup
(tests/cgroups.py) before its worker starts, so the worker and its rpc-server count against a cap, as
on a small machine. Namespaces, links and processes are removed by name/pid in `destroy`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.cgroups import CgroupUnavailable, MemoryCgroup, join, memory_cgroup

RPC_PORT = 50052
TAG = f"lr{os.getpid() % 100000}"  # names of our namespaces and links (interface names: at most 15 chars)
SUBNET = 10 + os.getpid() % 200  # 10.77.<SUBNET + i>.0/24, unlikely to meet another run's


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_usable() -> str | None:
    """Why this machine cannot make namespaces, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if shutil.which("nsenter") is None:
        return "the `nsenter` command (util-linux) is not installed"
    probe = f"{TAG}probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def worker_cache(base: Path, llama_backend: Path) -> Path:
    """A worker's own cache dir, holding the shared cpu build."""
    (base / "backends" / "llamacpp").mkdir(parents=True, exist_ok=True)
    link = base / "backends" / "llamacpp" / "cpu"
    if not link.exists():
        link.symlink_to(llama_backend, target_is_directory=True)
    return base


class Host:
    """One namespace joined to the root namespace by a veth pair, with a `lemonade worker` in it."""

    def __init__(self, index: int, tag: str = TAG) -> None:
        self.ns = f"{tag}h{index}"
        self.outer = f"{tag}o{index}"  # in the root namespace
        self.inner = f"{tag}i{index}"
        self.gateway = f"10.77.{SUBNET + index}.1"
        self.address = f"10.77.{SUBNET + index}.2"
        self.worker: subprocess.Popen[str] | None = None
        self.rpc_pids: set[int] = set()
        self.idle_rss = 0
        self.output = Path()
        self.cgroup: MemoryCgroup | None = None
        self._offset = 0
        self._start: tuple[Path, Path, list[str], dict[str, str]] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.address}:{RPC_PORT}"

    def create(self) -> None:
        ip("netns", "add", self.ns)
        ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        ip("link", "set", self.inner, "netns", self.ns)
        ip("addr", "add", f"{self.gateway}/24", "dev", self.outer)
        ip("link", "set", self.outer, "up")
        ip("-n", self.ns, "addr", "add", f"{self.address}/24", "dev", self.inner)
        ip("-n", self.ns, "link", "set", self.inner, "up")
        ip("-n", self.ns, "link", "set", "lo", "up")

    def limit_rate(self, rate: str) -> None:
        """Both directions of the link as fast as `rate` (`tc` rate, e.g. `1gbit`): a LAN, not memory speed."""
        for prefix, dev in ((["ip", "netns", "exec", self.ns], self.inner), ([], self.outer)):
            subprocess.run([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "1mbit",
                            "latency", "50ms"], check=True, capture_output=True, timeout=30)

    def cut(self, connected: bool = False) -> None:
        """Take the host off the network (its link down, nothing closed: a cable pulled), or back on it."""
        ip("link", "set", self.outer, "up" if connected else "down")

    def start_worker(self, cache: Path, log_dir: Path, extra: list[str] | None = None,
                     env_extra: dict[str, str] | None = None) -> None:
        """`extra`: more `lemonade worker` options (--cache, --broadcast); `env_extra`: more environment
        (LEMONADE_BEACON_PORT). In the host's cgroup, if it has one."""
        self._start = (cache, log_dir, list(extra or []), dict(env_extra or {}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LEMONADE_")}
        env.update({"LEMONADE_CACHE_DIR": str(cache), "LEMONADE_CONFIG_DIR": str(cache), "PYTHONUNBUFFERED": "1",
                    **(env_extra or {})})
        self.output = log_dir / f"{self.ns}.log"
        self._offset = self.output.stat().st_size if self.output.exists() else 0  # this run's output starts here
        group = self.cgroup
        with open(self.output, "a") as log:
            self.worker = subprocess.Popen(
                # nsenter, not `ip netns exec`: that one remounts /sys, which hides the cgroup filesystem
                # the worker reads its memory cap from (a real host has its own)
                ["nsenter", f"--net=/run/netns/{self.ns}", sys.executable, "-m", "lemonade.cli.main", "worker",
                 "--host", self.address, "--port", str(RPC_PORT), "--backend", "cpu", "--threads", "1",
                 *(extra or [])],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                start_new_session=True, preexec_fn=(lambda: join(group)) if group is not None else None)

    def restart_worker(self) -> None:
        """The worker again, with the options it had."""
        assert self._start is not None
        self.rpc_pids.clear()
        self.start_worker(*self._start)

    def wait_serving(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.run_output()
            if "serving on" in text:
                self.idle_rss = self.rpc_rss()
                return text
            if self.worker is not None and self.worker.poll() is not None:
                raise RuntimeError(f"lemonade worker in {self.ns} exited with {self.worker.returncode}:\n{text}")
            time.sleep(0.2)
        raise RuntimeError(f"lemonade worker in {self.ns} did not serve within {timeout:.0f}s:\n" + self.run_output())

    def run_output(self) -> str:
        """What the current run of the worker printed."""
        with open(self.output, errors="replace") as fh:
            fh.seek(self._offset)
            return fh.read()

    def rpc_rss(self) -> int:
        """Resident memory of the worker's rpc-server (the weights it received live there)."""
        self._remember_children()
        total = 0
        for pid in self.rpc_pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += psutil.Process(pid).memory_info().rss
        return total

    def _remember_children(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.rpc_pids |= {p.pid for p in psutil.Process(self.worker.pid).children(recursive=True)}

    def rpc_server_pid(self) -> int | None:
        """The worker's ggml-rpc-server."""
        self._remember_children()
        for pid in self.rpc_pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).name().startswith("ggml-rpc"):
                    return pid
        return None

    def stop_worker(self) -> int | None:
        """SIGTERM the worker (as an init system stops it); its rpc-server must go with it."""
        if self.worker is None:
            return None
        self._remember_children()
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait(5)
        return self.worker.returncode

    def kill_worker(self) -> None:
        """SIGKILL the worker's whole process group, rpc-server included (a host that dies)."""
        if self.worker is None:
            return
        self._remember_children()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGKILL)
        for pid in self.rpc_pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        self.worker.wait(10)

    def destroy(self) -> None:
        self.stop_worker()
        for pid in self.rpc_pids:  # by pid, never by name
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        ip("link", "del", self.outer, check=False)  # takes its peer along
        ip("netns", "del", self.ns, check=False)


@contextlib.contextmanager
def worker_hosts(count: int, tag: str, llama_backend: Path, tmp_path_factory: pytest.TempPathFactory, *,
                 options: Callable[[int], list[str]] = lambda i: [], env: dict[str, str] | None = None,
                 cap_bytes: int | None = None) -> Iterator[list[Host]]:
    """`count` hosts, each serving a `lemonade worker` (`options(i)`: its extra options, i from 0) with a
    cache dir of its own holding the shared cpu build, each in a memory cgroup capped at `cap_bytes` if
    given; all removed afterwards. Skips the test, saying why, where namespaces or cgroups cannot be made."""
    reason = netns_usable()
    if reason:
        pytest.skip(f"llama.cpp RPC across network namespaces: {reason}")
    if not (llama_backend / "ggml-rpc-server").is_file():
        pytest.fail(f"{llama_backend} has no ggml-rpc-server: the cpu build lacks -DGGML_RPC=ON")
    with contextlib.ExitStack() as stack:
        made: list[Host] = []
        for i in range(1, count + 1):
            host = Host(i, tag)
            if cap_bytes is not None:
                try:
                    host.cgroup = stack.enter_context(memory_cgroup(f"lemonade-test-{host.ns}", cap_bytes))
                except CgroupUnavailable as exc:
                    pytest.skip(f"no memory-capped host can be made here: {exc}")
            stack.callback(host.destroy)  # before its cgroup goes
            made.append(host)
            host.create()
        for i, host in enumerate(made):
            cache = worker_cache(tmp_path_factory.mktemp(f"worker-{host.ns}"), llama_backend)
            host.start_worker(cache, cache, options(i), env)
        for host in made:
            host.wait_serving()
        yield made
