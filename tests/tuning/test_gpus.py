import types

import pytest

from kdagen.cache import gpus
from kdagen.cache.gpus import PROFILES, detect_current, get_profile, triton_target

NAMED_IN_DOCS = ("h800", "h200", "h100", "h20")  # README's and the design card's commands and figures


def test_every_registry_gpu_is_recognised_by_its_device_name(monkeypatch):
    """The device-name patterns and the registry agree: a device whose CUDA name is a profile's
    description and whose SM count is the profile's is that profile (and no other), so its
    tuning cache file and compile target are the profile's."""
    for p in PROFILES.values():
        _fake_cuda(monkeypatch, f"NVIDIA {p.description}", p.sm_count, *p.compute_capability)
        assert detect_current() is p, p.name
        assert get_profile(p.name.upper()) is p
        assert triton_target(p).arch == p.arch == 10 * p.compute_capability[0] + p.compute_capability[1]


def test_profiles_are_usable_for_build_and_cache():
    for name in NAMED_IN_DOCS:
        assert name in PROFILES
    for p in PROFILES.values():
        assert p.sm_count > 0 and p.smem_per_block_bytes > 0 and p.l2_bytes > 0
        assert p.mem_bandwidth_gbs > 0 and p.bf16_tflops > 0
        assert p.to_dict()["name"] == p.name and tuple(p.to_dict()["compute_capability"]) == p.compute_capability


def test_profile_is_frozen():
    with pytest.raises(Exception):
        PROFILES["h100"].sm_count = 1


def test_get_profile_case_insensitive():
    assert get_profile("H100") is PROFILES["h100"]
    assert get_profile(" rtx4090 ") is PROFILES["rtx4090"]


def test_unknown_gpu_lists_known_names():
    with pytest.raises(ValueError) as ei:
        get_profile("v100")
    msg = str(ei.value)
    assert "v100" in msg
    for name in PROFILES:
        assert name in msg


def test_triton_target():
    from triton.backends.compiler import GPUTarget

    assert triton_target(PROFILES["h100"]) == GPUTarget("cuda", 90, 32)
    assert triton_target(PROFILES["a100"]) == GPUTarget("cuda", 80, 32)
    assert triton_target(PROFILES["l40s"]).arch == 89
    assert triton_target(PROFILES["b200"]).arch == 100


def _fake_cuda(monkeypatch, name, sm, major=9, minor=0, **extra):
    import torch

    props = types.SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sm,
                                  L2_cache_size=40 * 2**20, clock_rate=1_800_000,
                                  memory_clock_rate=1_000_000, memory_bus_width=384,
                                  shared_memory_per_block=49152,
                                  shared_memory_per_multiprocessor=102400, **extra)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)


def test_detect_current_none_without_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert detect_current() is None


@pytest.mark.parametrize("device_name,sm,expected", [
    ("NVIDIA H200", 132, "h200"),
    ("NVIDIA H100 80GB HBM3", 132, "h100"),
    ("NVIDIA H100 PCIe", 114, "h100_pcie"),
    ("NVIDIA H800", 132, "h800"),
    ("NVIDIA H20", 78, "h20"),
    ("NVIDIA A100-SXM4-80GB", 108, "a100"),
    ("NVIDIA L40S", 142, "l40s"),
    ("NVIDIA GeForce RTX 4090", 128, "rtx4090"),
    ("NVIDIA B200", 148, "b200"),
])
def test_detect_current_matches_registry(monkeypatch, device_name, sm, expected):
    _fake_cuda(monkeypatch, device_name, sm)
    assert detect_current() is PROFILES[expected]


def test_detect_current_unknown_device_builds_profile(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA RTX A6000", 84, major=8, minor=6,
               shared_memory_per_block_optin=101376)
    p = detect_current()
    assert p is not None and p.name == "nvidia_rtx_a6000"
    assert p.compute_capability == (8, 6) and p.sm_count == 84
    assert p.smem_per_block_bytes == 101376
    assert p.l2_bytes == 40 * 2**20
    assert p.mem_bandwidth_gbs == pytest.approx(2 * 1e9 * 384 / 8 / 1e9)
    assert p.bf16_tflops > 0


def test_detect_current_cut_down_sku_of_known_family(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", 120)
    p = detect_current()
    assert p.name == "h100_120sm" and p.sm_count == 120
    assert p.bf16_tflops == pytest.approx(989 * 120 / 132, rel=1e-3)
    assert gpus.match_device_name("NVIDIA H200 NVL") is PROFILES["h200"]
    assert gpus.match_device_name("Tesla V100") is None
