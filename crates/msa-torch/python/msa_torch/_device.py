"""The device gate: which tensors and GPUs the kernels serve, with errors that name what was
found.

- A tensor that is not on a CUDA device is rejected before any op runs
  (:class:`UnsupportedDeviceError` naming the argument and its device).
- A CUDA device is served when a target compiled into the extension runs on its compute
  capability (``sm_90a`` SASS on 9.0, ``sm_80`` SASS on 8.x, ``compute_80`` PTX JIT-compiled on
  anything newer); the rule is msa-probe's (``_C.unsupported_reason``), the check runs once per
  device and is cached.
"""

from __future__ import annotations

import functools

import torch

from . import _ext


class UnsupportedDeviceError(RuntimeError):
    """A tensor is not on a CUDA device, or the device's compute capability is not served by the
    kernels built into this extension."""


def check_cuda(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """The one CUDA device of ``tensors`` (``None`` entries skipped); raises
    :class:`UnsupportedDeviceError` for a tensor elsewhere and ``ValueError`` for two devices.
    Trace-safe (reads only ``.device``)."""
    device = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type != "cuda":
            raise UnsupportedDeviceError(
                f"msa_torch.{op}: {name} is on {t.device} ({t.device.type} tensor); the msa-rs "
                "kernels run on CUDA devices only (compute capability 9.0 for the sm_90a "
                "kernels, 8.0 or newer for the portable ones): move the inputs to a GPU"
            )
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(
                f"msa_torch.{op}: {name} is on {t.device} but {first} is on {device}; all "
                "inputs must be on one device"
            )
    if device is None:
        raise ValueError(f"msa_torch.{op}: no tensor argument")
    return device


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


@functools.lru_cache(maxsize=None)
def _gate(index: int) -> tuple[int, int]:
    C = _ext.ext()
    major, minor = _capability(index)
    reason = C.unsupported_reason(index, major, minor)
    if reason is not None:
        name = torch.cuda.get_device_name(index)
        raise UnsupportedDeviceError(f"msa_torch: {name} (cuda:{index}): {reason}")
    return major, minor


def require(device: torch.device) -> tuple[int, int]:
    """The compute capability of ``device`` if the built kernels serve it, else
    :class:`UnsupportedDeviceError` naming the device, its capability and what was built.
    Cached per device."""
    if device.type != "cuda":
        raise UnsupportedDeviceError(
            f"msa_torch: {device} is not a CUDA device; the msa-rs kernels run on CUDA devices"
        )
    return _gate(_index(device))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# SM count an H100/H200 SXM has: what fake tensors of a CUDA device assume on a host without a
# GPU (it sizes the work list of prepare's metadata; on a GPU the device's own count is used).
FAKE_SM_COUNT = 132


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (cached): prepare balances its work list for them. On a
    host where torch sees no GPU (fake tensors under tracing) :data:`FAKE_SM_COUNT`."""
    if not torch.cuda.is_available():
        return FAKE_SM_COUNT
    return _sm_count(_index(device))


def kernel_set(device: torch.device, force_sm80: bool = False) -> str:
    """``"sm90a"`` on compute capability 9.0 (the wgmma/TMA kernels), else ``"sm80"``;
    ``force_sm80`` picks the portable kernels on any device."""
    if force_sm80:
        return "sm80"
    major, minor = require(device)
    return _ext.ext().kernel_set(major, minor)


def unavailable_reason(device: torch.device | int | str | None = None) -> str | None:
    """Why the kernels cannot run on ``device`` (default: the current CUDA device), or ``None``
    when they can: the extension is missing, torch sees no CUDA device, or the device's compute
    capability is not served. Never raises."""
    missing = _ext.extension_missing_reason()
    if missing is not None:
        return missing
    try:
        if not torch.cuda.is_available():
            return (
                "torch sees no CUDA device (torch.cuda.is_available() is False; torch "
                f"{torch.__version__}, CUDA {torch.version.cuda}); the msa-rs kernels need an "
                "NVIDIA GPU of compute capability 8.0 or newer (9.0 for the sm_90a kernels) and "
                "driver 580 or newer"
            )
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        else:
            device = torch.device(device)
        require(device)
    except Exception as e:  # noqa: BLE001 - the reason is the message
        return str(e)
    return None
