"""pytest setup of the msa-torch suite.

- ``gpu`` tests need a CUDA device the built kernels serve; they are skipped otherwise, with the
  reason (``msa_torch.unavailable_reason()``), unless ``MSA_TORCH_REQUIRE_GPU=1`` (set by
  run_gpu.sh), which turns that skip into a failure so a GPU run can never pass by skipping.
- The CPU tests need only torch and the installed wheel.
"""

import functools
import os

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU served by the built kernels (skipped otherwise)"
    )


@functools.lru_cache(maxsize=None)
def _gpu_reason():
    import msa_torch

    return msa_torch.unavailable_reason()


def pytest_runtest_setup(item):
    if "gpu" not in item.keywords:
        return
    reason = _gpu_reason()
    if reason is None:
        return
    if os.environ.get("MSA_TORCH_REQUIRE_GPU") == "1":
        pytest.fail(f"MSA_TORCH_REQUIRE_GPU=1 but the kernels cannot run here: {reason}")
    pytest.skip(f"no usable GPU: {reason}")
