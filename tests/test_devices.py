"""Device detection (system/devices.py) and which llama.cpp backends follow from it (backends/llamacpp/gpu.py).

The parsers read recorded outputs of real machines (tests/fixtures/devices/README.md names each
source); sysfs trees are laid out with the values those same machines reported. Then the real
detection on this machine, and the server's /v1/system-info, /v1/system-stats and /v1/install
answers built from it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import psutil
import pytest

from lemonade.backends.llamacpp.build import LLAMA_CPP_VERSION
from lemonade.backends.llamacpp.gpu import (
    backend_devices,
    best_backend,
    release_assets,
    unsupported_message,
    uses_gpu,
    vulkan_visible_devices,
)
from lemonade.backends.llamacpp.install import BackendInstaller
from lemonade.system.devices import (
    CpuFacts,
    DeviceReport,
    amd_npus,
    detect_devices,
    kfd_gfx_targets,
    parse_amd_smi_static,
    parse_cpuinfo,
    parse_nvidia_smi_csv,
    parse_rocm_smi_json,
    parse_system_profiler_displays,
    parse_vulkaninfo_summary,
    read_drm_cards,
    sysfs_gpus,
)
from tests.helpers import GEMMA_NAME, TEST_CACHE

FIXTURES = Path(__file__).parent / "fixtures" / "devices"
CPU = CpuFacts(name="test", arch="x86_64", cores=8, threads=16, isa=("avx2",), memory_bytes=32 * 2**30)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def drm_card(sys_root: Path, card: str, slot: str, files: dict[str, str], driver: str) -> None:
    """A /sys/class/drm/<card>/device link to a PCI device folder, as the kernel lays it out."""
    dev = sys_root / "devices" / "pci0000:00" / slot
    for name, value in files.items():
        write(dev / name, value)
    (sys_root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
    (dev / "driver").symlink_to(sys_root / "bus" / "pci" / "drivers" / driver)
    (sys_root / "class" / "drm" / card).mkdir(parents=True)
    (sys_root / "class" / "drm" / card / "device").symlink_to(dev)


# --- parsers on recorded outputs ---------------------------------------------------------------


def test_vulkaninfo_lavapipe_is_a_cpu_device():
    [dev] = parse_vulkaninfo_summary(fixture("vulkaninfo_lavapipe_debian12.txt"))
    assert dev.index == 0 and dev.type == "cpu" and not dev.is_gpu
    assert dev.name.startswith("llvmpipe") and dev.driver == "llvmpipe" and dev.vendor_id == 0x10005


def test_vulkaninfo_integrated_and_discrete_gpus():
    intel, amd = parse_vulkaninfo_summary(fixture("vulkaninfo_intel_hd530_amd_r9_380_windows.txt"))
    assert (intel.index, intel.type, intel.vendor_id, intel.device_id) == (0, "integrated", 0x8086, 0x1912)
    assert intel.name == "Intel(R) HD Graphics 530" and intel.api_version == "1.2.203"
    assert (amd.index, amd.type, amd.vendor_id, amd.name) == (1, "discrete", 0x1002, "AMD Radeon (TM) R9 380 Series")
    [rx] = parse_vulkaninfo_summary(fixture("vulkaninfo_rx6600xt_linux.txt"))
    assert rx.is_gpu and rx.device_id == 0x73FF and rx.driver == "AMD proprietary driver"
    assert parse_vulkaninfo_summary("ERROR: [Loader Message] vkCreateInstance failed") == []


def test_nvidia_smi_csv_by_header():
    (titan, u0), (ada, _) = parse_nvidia_smi_csv(fixture("nvidia_smi_titanv_rtx5880.csv"))
    assert (titan.name, titan.index, titan.family, titan.driver) == ("NVIDIA TITAN V", 0, "sm_70", "570.86.15")
    assert (ada.index, ada.family) == (1, "sm_89")
    assert titan.vram_bytes is None and u0.gpu_percent is None  # not queried: unknown, not zero
    a, b = (g for g, _ in parse_nvidia_smi_csv(fixture("nvidia_smi_2x_a100.csv")))
    assert (a.index, b.index, a.family, a.name) == (0, 1, "sm_80", "NVIDIA PG509-210")
    # the query Lemonade runs, in the shape nvidia-smi prints it (units in the header with nounits)
    [(gpu, usage)] = parse_nvidia_smi_csv(
        "index, name, uuid, pci.bus_id, compute_cap, driver_version, memory.total [MiB], memory.used [MiB], "
        "utilization.gpu [%]\n0, NVIDIA GeForce RTX 3090, GPU-1, 00000000:01:00.0, 8.6, 550.90.07, 24576, 1024, "
        "[N/A]\n")
    assert gpu.vram_bytes == 24 * 2**30 and gpu.pci_slot == "0000:01:00.0" and gpu.vram_gb == 24.0
    assert usage.vram_used_bytes == 2**30 and usage.gpu_percent is None


def test_amd_gpu_from_sysfs_rocm_smi_and_kfd(tmp_path):
    """The RX 7900 XT of the rocm-smi fixture, as sysfs and the kfd topology show it."""
    sys_root = tmp_path / "sys"
    drm_card(sys_root, "card0", "0000:03:00.0", {
        "vendor": "0x1002", "device": "0x744c", "mem_info_vram_total": "21458059264",
        "mem_info_vram_used": "27856896", "mem_info_gtt_total": "16777216000", "gpu_busy_percent": "0"}, "amdgpu")
    write(sys_root / "class" / "kfd" / "kfd" / "topology" / "nodes" / "1" / "properties",
          "cpu_cores_count 0\nsimd_count 168\ngfx_target_version 110000\nvendor_id 4098\ndevice_id 29772")
    cards = read_drm_cards(sys_root)
    assert [(c.card, c.vendor, c.pci_slot, c.driver) for c in cards] == [("card0", 0x1002, "0000:03:00.0", "amdgpu")]
    assert kfd_gfx_targets(sys_root) == {0x744C: "gfx1100"}
    rocm = parse_rocm_smi_json(fixture("rocm_smi_rx7900xt.json"))
    [(gpu, usage)] = sysfs_gpus(cards, kfd_gfx_targets(sys_root), rocm, [])
    assert (gpu.kind, gpu.name, gpu.family, gpu.source) == ("amd_gpu", "Radeon RX 7900 XT", "gfx1100", "rocm-smi")
    assert gpu.vram_gb == 20.0 and gpu.shared_bytes == 16777216000
    assert usage.gpu_percent == 0.0 and usage.vram_used_bytes == 27856896
    # without rocm-smi: named after the Vulkan device, family from the kfd topology
    [(plain, _)] = sysfs_gpus(cards, kfd_gfx_targets(sys_root), {}, [])
    assert plain.family == "gfx1100" and plain.source == "sysfs" and "744c" in plain.name


def test_amd_gpu_named_by_amd_smi(tmp_path):
    """The MI350X of the amd-smi fixture: sysfs has no name for it, amd-smi does (matched by PCI address)."""
    sys_root = tmp_path / "sys"
    drm_card(sys_root, "card1", "0000:05:00.0", {"vendor": "0x1002", "device": "0x75a0"}, "amdgpu")
    static = parse_amd_smi_static(fixture("amd_smi_static_mi350x.txt"))
    assert static["0000:05:00.0"]["MARKET_NAME"] == "AMD Instinct MI350X"
    [(gpu, _)] = sysfs_gpus(read_drm_cards(sys_root), {}, {}, [], static)
    assert (gpu.name, gpu.family, gpu.source) == ("AMD Instinct MI350X", "gfx950", "amd-smi")


def test_intel_igpu_from_sysfs_named_by_vulkan(tmp_path):
    sys_root = tmp_path / "sys"
    drm_card(sys_root, "card0", "0000:00:02.0", {"vendor": "0x8086", "device": "0x1912"}, "i915")
    vulkan = parse_vulkaninfo_summary(fixture("vulkaninfo_intel_hd530_amd_r9_380_windows.txt"))
    [(gpu, usage)] = sysfs_gpus(read_drm_cards(sys_root), {}, {}, vulkan)
    assert (gpu.kind, gpu.name, gpu.integrated, gpu.vulkan_index) == ("intel_gpu", "Intel(R) HD Graphics 530", True, 0)
    assert gpu.vram_bytes is None and usage.gpu_percent is None


def test_apple_silicon_metal_shares_memory():
    [m3] = parse_system_profiler_displays(fixture("system_profiler_m3_pro.json"), 36 * 2**30)
    assert (m3.kind, m3.name, m3.integrated, m3.vram_bytes, m3.family) == ("metal", "Apple M3 Pro", True, 36 * 2**30,
                                                                           "metal")
    [m1] = parse_system_profiler_displays(fixture("system_profiler_m1.json"), 8 * 2**30)
    assert m1.name == "Apple M1"


def test_amd_npu_from_accel_nodes(tmp_path):
    dev, sys_root = tmp_path / "dev", tmp_path / "sys"
    write(dev / "accel" / "accel0", "")
    pci = sys_root / "devices" / "pci0000:00" / "0000:c5:00.1"
    write(pci / "device", "0x17f0")
    (sys_root / "bus" / "pci" / "drivers" / "amdxdna").mkdir(parents=True)
    (pci / "driver").symlink_to(sys_root / "bus" / "pci" / "drivers" / "amdxdna")
    (sys_root / "class" / "accel" / "accel0").mkdir(parents=True)
    (sys_root / "class" / "accel" / "accel0" / "device").symlink_to(pci)
    [npu] = amd_npus(dev, sys_root, cpu_name="AMD Ryzen AI 9 HX 370")
    assert (npu.family, npu.device_node, npu.name) == ("XDNA2", str(dev / "accel" / "accel0"), "AMD Ryzen AI 9 HX 370")
    assert amd_npus(tmp_path / "nodev", sys_root) == []


def test_cpuinfo_isa():
    name, isa = parse_cpuinfo("processor\t: 0\nmodel name\t: AMD Ryzen 9 7950X 16-Core Processor\n"
                              "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 avx512_vnni\n")
    assert name == "AMD Ryzen 9 7950X 16-Core Processor"
    assert isa == ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16")
    assert parse_cpuinfo("Features\t: fp asimd asimddp sve i8mm\n")[1] == ("asimd", "asimddp", "i8mm", "sve")


# --- which backends a machine may use ----------------------------------------------------------


def report_of(*, vulkan: str | None = None, nvidia: str | None = None, amd: bool = False) -> DeviceReport:
    gpus = [g for g, _ in parse_nvidia_smi_csv(fixture(nvidia))] if nvidia else []
    vk = parse_vulkaninfo_summary(fixture(vulkan)) if vulkan else []
    if amd:
        from lemonade.system.devices import Gpu

        gpus.append(Gpu(kind="amd_gpu", name="Radeon RX 7900 XT", index=0, family="gfx1100"))
    return DeviceReport(cpu=CPU, gpus=tuple(gpus), vulkan=tuple(vk))


def test_backends_follow_the_devices():
    lavapipe = report_of(vulkan="vulkaninfo_lavapipe_debian12.txt")
    assert [backend_devices(b, lavapipe, "linux") for b in ("cpu", "vulkan", "rocm", "cuda", "metal")] == \
        [["cpu"], [], [], [], []]
    assert best_backend(lavapipe, "linux") is None and vulkan_visible_devices(lavapipe) == "0"
    assert "llvmpipe" in unsupported_message("vulkan", lavapipe, "linux")
    assert not uses_gpu("vulkan", lavapipe)

    amd = report_of(vulkan="vulkaninfo_rx6600xt_linux.txt", amd=True)
    assert backend_devices("vulkan", amd, "linux") == backend_devices("rocm", amd, "linux") == ["amd_gpu"]
    assert best_backend(amd, "linux") == "rocm" and vulkan_visible_devices(amd) is None  # the guide: ROCm first

    nv = report_of(nvidia="nvidia_smi_titanv_rtx5880.csv")
    assert backend_devices("cuda", nv, "linux") == ["nvidia_gpu"] and best_backend(nv, "linux") == "cuda"
    volta_only = DeviceReport(cpu=CPU, gpus=(nv.gpus[0],))  # TITAN V: sm_70, older than the CUDA builds
    assert backend_devices("cuda", volta_only, "linux") == []
    assert "7.5" in unsupported_message("cuda", volta_only, "linux")

    intel = report_of(vulkan="vulkaninfo_intel_hd530_amd_r9_380_windows.txt")
    assert backend_devices("vulkan", intel, "win32") == ["intel_gpu", "amd_gpu"]
    assert best_backend(intel, "win32") == "vulkan"
    assert unsupported_message("metal", intel, "linux") == "Requires macOS"


def test_release_assets_are_the_pinned_builds_own_names():
    """Every archive name we ask for appears in the pinned llama.cpp's own release workflow."""
    tag = LLAMA_CPP_VERSION
    expect = {
        ("vulkan", "linux", "x86_64"): [f"llama-{tag}-bin-ubuntu-vulkan-x64.tar.gz"],
        ("vulkan", "linux", "aarch64"): [f"llama-{tag}-bin-ubuntu-vulkan-arm64.tar.gz"],
        ("vulkan", "win32", "AMD64"): [f"llama-{tag}-bin-win-vulkan-x64.zip"],
        ("rocm", "linux", "x86_64"): [f"llama-{tag}-bin-ubuntu-rocm-10.0-x64.tar.gz"],
        ("cuda", "linux", "x86_64"): [f"llama-{tag}-bin-ubuntu-cuda-12.8-x64.tar.gz",
                                      f"cudart-llama-{tag}-bin-ubuntu-cuda-12.8-x64.tar.gz"],
        ("cuda", "win32", "AMD64"): [f"llama-{tag}-bin-win-cuda-12.4-x64.zip",
                                     "cudart-llama-bin-win-cuda-12.4-x64.zip"],
        ("metal", "darwin", "arm64"): [f"llama-{tag}-bin-macos-arm64.tar.gz"],
        ("metal", "linux", "x86_64"): [],
        ("rocm", "darwin", "arm64"): [],
    }
    for (backend, system, machine), names in expect.items():
        assert release_assets(backend, tag, system, machine) == names, (backend, system, machine)
    src = BackendInstaller(TEST_CACHE).source_dir()
    if src is None or not (src / ".github" / "workflows" / "release.yml").is_file():
        pytest.skip("the pinned llama.cpp sources (with .github/workflows/release.yml) are not extracted here")
    workflow = (src / ".github" / "workflows" / "release.yml").read_text()
    for names in expect.values():
        for name in names:
            assert name.replace(tag, "${{ steps.tag.outputs.name }}") in workflow, name


# --- this machine ------------------------------------------------------------------------------


def test_real_detection_here():
    report = detect_devices(refresh=True)
    assert report.cpu.threads == psutil.cpu_count() and report.cpu.cores >= 1
    assert report.cpu.memory_bytes == psutil.virtual_memory().total
    flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split()) \
        if Path("/proc/cpuinfo").is_file() else set()
    assert ("avx2" in report.cpu.isa) == ("avx2" in flags)
    if shutil.which("vulkaninfo"):
        assert report.vulkan, "vulkaninfo is installed (mesa-vulkan-drivers gives lavapipe) but no device was read"
    if not Path("/sys/class/drm").exists() and not shutil.which("nvidia-smi"):
        assert report.gpus == ()  # nothing to find: no GPU is made up


def test_server_reports_devices_and_refuses_gpu_backends_without_devices(make_server, gemma_dir):
    server = make_server(env={"LEMONADE_LLAMACPP_NO_RELEASE": "1", "LEMONADE_EXTRA_MODELS_DIR": str(gemma_dir)},
                         engines=("llamacpp",))
    report = detect_devices()
    with server.client() as c:
        bad = c.post("/v1/load", json={"model_name": GEMMA_NAME, "llamacpp_device": "--device /dev/x"})
        assert bad.status_code == 400 and "llamacpp_device" in bad.json()["error"]["message"], bad.text
        info = c.get("/v1/system-info").json()
        devices = info["devices"]
        assert devices["cpu"]["cores"] == report.cpu.cores and devices["cpu"]["isa"] == list(report.cpu.isa)
        assert [v["name"] for v in devices["vulkan"]] == [v.name for v in report.vulkan]
        assert len(devices["amd_gpu"]) == len(report.gpus_of("amd_gpu"))
        llama = info["recipes"]["llamacpp"]
        assert set(llama["backends"]) == {"cpu", "system", "vulkan", "rocm", "cuda", "metal"}
        assert llama["default_backend"] == (best_backend(report) or "cpu")
        stats = c.get("/v1/system-stats").json()
        if not report.gpus:
            assert stats["gpu_percent"] is None and stats["vram_gb"] is None
        if report.gpus or report.vulkan_gpus:
            pytest.skip("this machine has a GPU: the refusals below are for GPU-less machines")
        vulkan = llama["backends"]["vulkan"]
        assert vulkan["state"] == "unsupported" or BackendInstaller(server.cache).llama_server_path("vulkan")
        for backend in ("rocm", "cuda"):
            resp = c.post("/v1/install", json={"recipe": "llamacpp", "backend": backend})
            assert resp.status_code == 400 and "force" in resp.json()["error"]["message"], resp.text
        resp = c.post("/v1/install", json={"recipe": "llamacpp", "backend": "metal", "force": True})
        assert resp.status_code == 400 and "Requires macOS" in resp.json()["error"]["message"]
        if shutil.which("hipcc") is None and not os.path.exists("/opt/rocm/bin/hipcc"):
            # forced past the hardware filter, the source build stops before any work, naming what is missing
            resp = c.post("/v1/install", json={"recipe": "llamacpp", "backend": "rocm", "force": True})
            assert resp.status_code == 500 and "hipcc" in resp.json()["error"]["message"], resp.text
            assert not (server.cache / "backends" / "llamacpp" / "rocm").exists()
