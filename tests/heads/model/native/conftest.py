"""The fused ops with the integer groups' GEMV, built and loaded (skipped without AVX512-BW)."""

from __future__ import annotations

import pytest
import torch

from heads.model.native import build


@pytest.fixture(scope="module")
def ops() -> object:
    assert build.load(), "fused CPU ops did not build"
    if not hasattr(torch.ops.polyhead, "gemv_groups"):
        pytest.skip("this CPU has no AVX512-BW: the groups' GEMV is not built")
    return torch.ops.polyhead
