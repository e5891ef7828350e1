"""GPU profiles: the handful of hardware numbers the generator, heuristics and tuner need.

A :class:`GpuProfile` is a frozen record of datasheet figures.  :data:`PROFILES` holds the
GPUs we know by name; :func:`get_profile` looks one up, :func:`detect_current` maps the
current CUDA device onto a profile (or builds one from the device properties when the
device is not in the registry) and :func:`triton_target` gives the ``GPUTarget`` used to
compile for a profile without the device being present (cross-compilation on CPU).

Figures are dense (no sparsity) bf16 tensor-core throughput with fp32 accumulation where
the datasheet gives it, memory bandwidth in GB/s (10^9 bytes/s), and the largest dynamic
shared memory a single block may opt in to (``cudaDevAttrMaxSharedMemoryPerBlockOptin``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True)
class GpuProfile:
    name: str  # registry name, also the tuning-cache file name (e.g. "h100")
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block_bytes: int  # max opt-in dynamic shared memory per block
    mem_bandwidth_gbs: float  # GB/s
    bf16_tflops: float  # dense
    l2_bytes: int
    description: str = ""

    @property
    def arch(self) -> int:
        """``major*10 + minor``, the integer Triton and ``sm_XX`` use (90 for H100)."""
        major, minor = self.compute_capability
        return major * 10 + minor

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "compute_capability": list(self.compute_capability),
            "sm_count": self.sm_count,
            "smem_per_block_bytes": self.smem_per_block_bytes,
            "mem_bandwidth_gbs": self.mem_bandwidth_gbs,
            "bf16_tflops": self.bf16_tflops,
            "l2_bytes": self.l2_bytes,
            "description": self.description,
        }


_SMEM_HOPPER = 227 * KiB  # 232448: sm_90 / sm_100 opt-in limit per block
_SMEM_A100 = 163 * KiB  # 166912: sm_80 opt-in limit per block
_SMEM_ADA = 99 * KiB  # 101376: sm_86 / sm_89 opt-in limit per block

PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("h100", (9, 0), 132, _SMEM_HOPPER, 3350.0, 989.0, 50 * MiB, "H100 SXM5 80GB"),
        GpuProfile("h100_pcie", (9, 0), 114, _SMEM_HOPPER, 2000.0, 756.0, 50 * MiB, "H100 PCIe 80GB"),
        GpuProfile("h800", (9, 0), 132, _SMEM_HOPPER, 3350.0, 989.0, 50 * MiB, "H800 SXM5 80GB"),
        GpuProfile("h200", (9, 0), 132, _SMEM_HOPPER, 4800.0, 989.0, 50 * MiB, "H200 SXM 141GB"),
        GpuProfile("h20", (9, 0), 78, _SMEM_HOPPER, 4000.0, 148.0, 60 * MiB, "H20 96GB"),
        GpuProfile("a100", (8, 0), 108, _SMEM_A100, 2039.0, 312.0, 40 * MiB, "A100 SXM4 80GB"),
        GpuProfile("l40s", (8, 9), 142, _SMEM_ADA, 864.0, 362.0, 96 * MiB, "L40S 48GB"),
        GpuProfile("rtx4090", (8, 9), 128, _SMEM_ADA, 1008.0, 165.0, 72 * MiB, "GeForce RTX 4090"),
        GpuProfile("b200", (10, 0), 148, _SMEM_HOPPER, 8000.0, 2250.0, 126 * MiB, "B200 SXM 180GB"),
    )
}

# Device-name patterns, tried in order (most specific first).  Matched against the
# lower-cased CUDA device name, e.g. "nvidia h100 80gb hbm3".
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bh100\b.*\bpcie\b", "h100_pcie"),
    (r"\bh100\b", "h100"),
    (r"\bh800\b", "h800"),
    (r"\bh200\b", "h200"),
    (r"\bh20\b", "h20"),
    (r"\ba100\b", "a100"),
    (r"\bl40s\b", "l40s"),
    (r"\brtx\s*4090\b|\b4090\b", "rtx4090"),
    (r"\bb200\b", "b200"),
)

# Dense bf16 tensor-core FLOPs per SM per clock, used only to estimate bf16_tflops for
# devices that are not in the registry.
_BF16_FLOPS_PER_SM_CLK = {(8, 0): 2048, (8, 6): 512, (8, 7): 1024, (8, 9): 1024,
                          (9, 0): 4096, (10, 0): 8192, (12, 0): 1024}


def known_names() -> list[str]:
    return sorted(PROFILES)


def get_profile(name: str) -> GpuProfile:
    """Registry lookup by name, case-insensitive (``"H100"`` and ``"h100"`` are the same)."""
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    try:
        return PROFILES[key]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(known_names())}") from None


def match_device_name(device_name: str) -> GpuProfile | None:
    """Registry profile whose pattern matches a CUDA device name, or None."""
    lowered = device_name.lower()
    for pattern, name in _NAME_PATTERNS:
        if re.search(pattern, lowered):
            return PROFILES[name]
    return None


def _sanitize(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return s or "unknown_gpu"


def profile_from_properties(props: Any, *, name: str | None = None,
                            like: GpuProfile | None = None) -> GpuProfile:
    """Build a profile from ``torch.cuda.get_device_properties`` output.

    Bandwidth is derived from the memory clock and bus width when torch reports them;
    bf16 throughput from SM count x clock x a per-architecture FLOPs/clock/SM table.  When
    ``like`` is given (a registry profile of the same family) its datasheet bandwidth and
    throughput are scaled by the SM-count ratio instead.
    """
    cc = (int(props.major), int(props.minor))
    sm = int(props.multi_processor_count)
    smem = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    if not smem:
        per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
        smem = per_sm - KiB if per_sm > KiB else int(getattr(props, "shared_memory_per_block", 48 * KiB))
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    if like is not None:
        ratio = sm / like.sm_count if like.sm_count else 1.0
        bw = like.mem_bandwidth_gbs * ratio
        tflops = like.bf16_tflops * ratio
        l2 = l2 or like.l2_bytes
    else:
        mem_khz = int(getattr(props, "memory_clock_rate", 0) or 0)
        bus_bits = int(getattr(props, "memory_bus_width", 0) or 0)
        bw = 2.0 * mem_khz * 1e3 * bus_bits / 8 / 1e9  # double data rate
        clk_khz = int(getattr(props, "clock_rate", 0) or 0)
        tflops = sm * clk_khz * 1e3 * _BF16_FLOPS_PER_SM_CLK.get(cc, 1024) / 1e12
    return GpuProfile(
        name=name or _sanitize(str(props.name)),
        compute_capability=cc,
        sm_count=sm,
        smem_per_block_bytes=smem,
        mem_bandwidth_gbs=round(bw, 1),
        bf16_tflops=round(tflops, 1),
        l2_bytes=l2,
        description=f"detected: {props.name}",
    )


def detect_current(device: int | None = None) -> GpuProfile | None:
    """Profile of the current (or given) CUDA device; None when there is no CUDA device.

    A registry profile is returned when the device name matches one and its SM count
    agrees; a device of a known family with another SM count (a cut-down SKU) or an
    unknown device gets a profile built from its properties, named after the device.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return None
    try:
        if not torch.cuda.is_available():
            return None
        dev = torch.cuda.current_device() if device is None else device
        device_name = torch.cuda.get_device_name(dev)
        props = torch.cuda.get_device_properties(dev)
    except Exception:
        return None
    known = match_device_name(device_name)
    if known is not None and int(props.multi_processor_count) == known.sm_count:
        return known
    if known is not None:
        return profile_from_properties(
            props, name=f"{known.name}_{int(props.multi_processor_count)}sm", like=known)
    return profile_from_properties(props)


def triton_target(profile: GpuProfile):
    """``GPUTarget("cuda", major*10+minor, 32)`` for compiling without the device."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", profile.arch, 32)
