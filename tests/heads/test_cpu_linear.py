"""oneDNN-packed projections: the same products as nn.Linear (to fp32 rounding), same state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from heads.engine.cpu_linear import PackedLinear, pack_linears, packing_available

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu"), torch.float32), reason="no oneDNN in this torch")


def test_packed_linear_matches_dense_at_every_batch_size() -> None:
    torch.manual_seed(0)
    dense = nn.Linear(64, 96, bias=False)
    packed = PackedLinear(dense)
    with torch.inference_mode():
        for b in (1, 3, 16, 65):
            x = torch.randn(b, 64)
            torch.testing.assert_close(packed(x), dense(x), atol=1e-5, rtol=1e-5)


def test_pack_linears_swaps_nested_layers_and_keeps_the_state_dict() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.Sequential(nn.Linear(16, 4, bias=False)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert pack_linears(model) == 2
    assert pack_linears(model) == 0  # already packed
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
