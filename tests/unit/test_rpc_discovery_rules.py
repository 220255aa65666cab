"""What llama.cpp RPC workers announce and how a server reads it (beacon.py's worker beacons,
backends/llamacpp/worker.py, `rpc_workers: "auto"`), on datagrams over loopback: no engine.

The end-to-end proof is tests/test_rpc_discovery.py (real workers in network namespaces, a real server
and `lemonade scan`).
"""

from __future__ import annotations

import socket
import time
from collections import namedtuple

import pytest

from lemonade import beacon
from lemonade.backends.llamacpp import worker as llamacpp_worker
from lemonade.backends.llamacpp.engine import LlamaCppEngine
from lemonade.backends.llamacpp.settings import WorkerSpecError, worker_setting
from lemonade.beacon import (
    STATUS_QUERY,
    WorkerBeacon,
    WorkerDirectory,
    decode,
    decode_worker,
    encode_worker,
    is_status_query,
)
from lemonade.cli.load_options import FLAGS
from lemonade.config import Config, parse_cli_value

MiB = 1 << 20
CPU = {"name": "CPU", "description": "AMD EPYC", "total_bytes": 4096 * MiB, "free_bytes": 1024 * MiB}


def test_rpc_workers_takes_a_list_or_auto_and_nothing_else(tmp_path):
    assert worker_setting("auto") == "auto" and worker_setting(" AUTO ") == "auto"
    assert worker_setting("") == [] and worker_setting(["10.0.0.2:50052"]) == ["10.0.0.2:50052"]
    with pytest.raises(WorkerSpecError, match="auto"):
        worker_setting("10.0.0.2:50052")  # a load option takes a list
    check_option = LlamaCppEngine.options["rpc_workers"].check  # the load option's, from the descriptor
    assert check_option is not None
    assert check_option("auto") is None and check_option(["10.0.0.2:50052"]) is None
    refusal = check_option(["nohostport"]) or ""
    assert refusal.startswith("Option 'rpc_workers': RPC worker 'nohostport' must be host:port")
    assert (check_option(7) or "").startswith("Option 'rpc_workers' must be a list")
    # server-wide: `lemonade config set llamacpp.rpc_workers=auto`, or the environment
    assert parse_cli_value("llamacpp.rpc_workers", "auto") == "auto"
    assert Config(tmp_path, environ={"LEMONADE_LLAMACPP_RPC_WORKERS": "auto"}).get("llamacpp.rpc_workers") == "auto"
    flag = next(f for f in FLAGS if f.key == "rpc_workers")  # `lemonade load --rpc-workers auto`
    assert flag.value("auto") == "auto" and flag.value("a:1, b:2") == ["a:1", "b:2"]


def test_a_worker_beacon_reads_back_and_server_listeners_pass_it_by():
    sent = WorkerBeacon("box", "10.0.0.2:50052", "", "cpu", (CPU,), busy=True, cache=True)
    data = encode_worker(sent)
    got = decode_worker(data, "10.0.0.2")
    assert got is not None and got.endpoint == "10.0.0.2:50052" and got.sender == "10.0.0.2"
    assert got.devices == (CPU,) and got.busy and got.cache and got.free_bytes == 1024 * MiB
    assert decode(data, "10.0.0.2") is None  # no url: listeners of server beacons (Lemonade's apps too) skip it
    server = b'{"service": "lemonade", "hostname": "h", "url": "http://10.0.0.3:13305/api/v1/"}'
    assert decode_worker(server, "10.0.0.3") is None
    assert decode_worker(STATUS_QUERY, "10.0.0.3") is None  # a query is not an announcement


@pytest.mark.parametrize("payload", [
    b'{"service": "lemonade-worker", "hostname": "h", "endpoint": "nohostport", "devices": []}',
    b'{"service": "lemonade-worker", "hostname": "h", "endpoint": "10.0.0.2:1", "devices": []}',
    b'{"service": "lemonade-worker", "hostname": "h", "endpoint": "10.0.0.2:1", "devices": [{"name": "CPU"}]}',
    b'{"service": "lemonade-worker", "hostname": "h", "endpoint": "10.0.0.2:1", '
    b'"devices": [{"name": "CPU", "total_bytes": -1, "free_bytes": 0}]}',
    b"\xff\xfe", b"[]",
])
def test_a_malformed_worker_beacon_is_ignored(payload):
    assert decode_worker(payload, "10.0.0.2") is None


def test_a_status_query_is_as_large_as_its_answer_so_a_forged_sender_gains_nothing():
    assert is_status_query(STATUS_QUERY)
    assert not is_status_query(STATUS_QUERY.strip())  # unpadded: not answered
    answer = encode_worker(WorkerBeacon("box", "10.0.0.2:50052", "", "cpu", (CPU,)))
    assert len(answer) <= len(STATUS_QUERY)


def test_the_worker_reports_its_devices_as_the_rpc_server_lists_them_and_its_cpu_by_its_budget(monkeypatch):
    dev = llamacpp_worker.parse_device("  CPU: AMD EPYC (24105 MiB, 24105 MiB free)")
    assert dev == {"name": "CPU", "description": "AMD EPYC", "total_bytes": 24105 * MiB, "free_bytes": 24105 * MiB}
    assert llamacpp_worker.parse_device("  transport      : TCP") is None
    gpu = llamacpp_worker.parse_device("  Vulkan0: Radeon 780M (16384 MiB, 15000 MiB free)")
    assert gpu is not None
    status = llamacpp_worker.WorkerStatus("box", "vulkan", [dev, gpu], cache=False)
    # the rpc-server calls all of the machine's RAM free; the worker says what its memory budget allows
    monkeypatch.setattr(llamacpp_worker, "cpu_free_bytes", lambda: 150 * MiB)
    reported = status.beacon("10.0.0.2:50052")
    assert [d["free_bytes"] for d in reported.devices] == [150 * MiB, 15000 * MiB]
    assert not reported.busy
    status.seen("Accepted client connection")
    assert status.beacon("10.0.0.2:50052").busy
    status.seen("Client connection closed")
    assert not status.beacon("10.0.0.2:50052").busy


def test_an_interface_without_a_broadcast_address_gets_its_subnets(monkeypatch):
    import psutil

    addr = namedtuple("addr", "family address netmask broadcast ptp")
    stats = namedtuple("stats", "isup")
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: {
        "veth0": [addr(socket.AF_INET, "10.77.5.2", "255.255.255.0", "10.77.5.2", None)],
        "eth0": [addr(socket.AF_INET, "192.168.1.7", "255.255.255.0", "192.168.1.255", None)]})
    monkeypatch.setattr(psutil, "net_if_stats", lambda: {"veth0": stats(True), "eth0": stats(True)})
    assert beacon.lan_interfaces() == [("10.77.5.2", "10.77.5.255"), ("192.168.1.7", "192.168.1.255")]


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_directory_keeps_workers_that_announce_themselves_and_drops_beacons_naming_another_host():
    port = _free_udp_port()
    directory = WorkerDirectory(port)
    assert directory.workers(wait=False) == []  # starts listening
    own = WorkerBeacon("box", "127.0.0.1:50052", "", "cpu", (CPU,))
    forged = WorkerBeacon("evil", "10.0.0.9:50052", "", "cpu", (CPU,))  # sent from 127.0.0.1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not directory.workers(wait=False):
            sock.sendto(encode_worker(forged), ("127.0.0.1", port))
            sock.sendto(encode_worker(own), ("127.0.0.1", port))
            time.sleep(0.1)
    heard = directory.workers(wait=False)
    assert [b.endpoint for b in heard] == ["127.0.0.1:50052"]
    assert directory.workers(max_age=0.0, wait=False) == []  # gone quiet: no longer used


def test_an_idle_rpc_server_counts_what_it_kept_from_its_last_client_as_free(monkeypatch):
    """glibc keeps freed buffers: an rpc-server whose client left is as large as the last model made it,
    and the next model's layers go there, so that part counts as free while no client is connected."""
    import os

    monkeypatch.setattr(llamacpp_worker, "cpu_free_bytes", lambda: 100 * MiB)
    status = llamacpp_worker.WorkerStatus("box", "cpu", [dict(CPU, total_bytes=8192 * MiB, free_bytes=8192 * MiB)],
                                          cache=False)
    status.serving(os.getpid())  # this process stands in for the rpc-server
    status.idle_bytes -= 40 * MiB  # it has grown by 40 MiB since
    assert status.beacon("e:1").devices[0]["free_bytes"] >= 140 * MiB - MiB
    status.seen("Accepted client connection")  # serving someone: what it holds is theirs
    assert status.beacon("e:1").devices[0]["free_bytes"] == 100 * MiB
