"""MultiHeadModel: one backbone plus the named embedding/unembedding matrices of its heads.

Tensor names (the checkpoint's safetensors keys):

- `backbone.<key>`: the backbone, keys as documented in `heads/model/llama.py` and
  `heads/model/gemma3.py`;
- the matrix names that `HeadSpec.embedding` / `HeadSpec.unembedding` refer to, for example
  `matrices.shared` [V_max, d]. A name used by several heads or roles is stored once (tied),
  and head h reads rows [0, V_h) of it (Matryoshka order);
- `HeadSpec.adapter.prefix` + bias/a/b/down/up: a trimmed head's adapter (heads/model/adapter.py),
  read from its sidecar file; not part of `state_dict_for_save`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn

from heads.errors import CheckpointError
from heads.manifest import READING_SUFFIX, HeadSpec, Manifest
from heads.model.adapter import HeadOutput, build_output
from heads.model.attention import KVCache, StepMetadata
from heads.model.gemma3 import Gemma3Backbone
from heads.model.llama import LlamaBackbone
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

BACKBONE_PREFIX = "backbone."
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_backbone(manifest: Manifest) -> nn.Module:
    if manifest.backbone.architecture == "llama":
        return LlamaBackbone(manifest.backbone)
    if manifest.backbone.architecture == "gemma3":
        return Gemma3Backbone(manifest.backbone)
    raise CheckpointError(
        f"backbone.architecture: {manifest.backbone.architecture!r} is not supported by the "
        "local engine"
    )


class MultiHeadModel(nn.Module):
    def __init__(
        self, manifest: Manifest, tensors: dict[str, torch.Tensor], compute_dtype: str | None = None
    ) -> None:
        """`compute_dtype` overrides the stored dtype: on CPU, bf16 weights run faster upcast
        once to float32 than converted per step (no native bf16 GEMM with fp32 output)."""
        super().__init__()
        manifest.validate()
        self.manifest = manifest
        self.dtype_name = compute_dtype or manifest.dtype
        if self.dtype_name not in _DTYPES:
            raise CheckpointError(f"compute dtype {self.dtype_name!r} not in {sorted(_DTYPES)}")
        self.dtype = _DTYPES[self.dtype_name]
        self.heads: dict[str, HeadSpec] = {h.name: h for h in manifest.heads}
        self._readings: dict[str, str] = {}  # reading -> the split head it reads (add_reading)
        self.backbone = build_backbone(manifest)
        self._load_backbone(tensors)
        # Matrix names contain dots, which module attribute names may not, so each one is a
        # buffer `matrix_{i}` (moved by .to()) found through `_matrix_attr`.
        self._matrix_attr: dict[str, str] = {}
        for name in self._matrix_names():
            if name not in tensors:
                raise CheckpointError(f"tensor {name!r}: missing (named by a head)")
            attr = f"matrix_{len(self._matrix_attr)}"
            self.register_buffer(attr, tensors[name].to(self.dtype))
            self._matrix_attr[name] = attr
        self._check_matrices()
        self._adapter_attr: dict[str, dict[str, str]] = {}  # head -> role -> buffer name
        self._load_adapters(tensors)
        self.backbone.to(self.dtype)
        # The source file's quantised values by tensor name, where loaded (load_checkpoint's
        # int8): the CPU engine multiplies few rows with them (kernels.int_groups).
        self.int8: dict[str, IntGroups] = {}
        self.eval()

    def _load_adapters(self, tensors: dict[str, torch.Tensor]) -> None:
        native = max(self.manifest.heads, key=lambda h: h.vocab_size)
        for i, h in enumerate(self.manifest.heads):
            if h.adapter is not None and h is native:
                raise CheckpointError(f"heads[{i}].adapter: the native (largest) head is "
                                      "the reference and cannot be adapted")
            # A reading's first level is this head's rows too (the split head is nested in
            # the native matrix), so both adapters correct the same [V, d] rows.
            for served, adapter in h.adapters():
                out = build_output(adapter, self.unembedding_rows(h.name), tensors, self.dtype,
                                   f"heads[{i}] ({served})")
                # Buffers, so .to(device) moves them. The stored (unfolded) tensors stay in
                # their sidecar file: state_dict_for_save never writes them.
                roles = {"bias": out.bias}
                if adapter.kind == "lowrank":
                    roles["weight"] = out.weight
                else:
                    roles.update({"down": out.down, "up": out.up})
                attrs: dict[str, str] = {}
                for role, t in roles.items():
                    attrs[role] = f"adapter_{len(self._adapter_attr)}_{len(attrs)}"
                    self.register_buffer(attrs[role], t)
                self._adapter_attr[served] = attrs

    def _matrix_names(self) -> list[str]:
        names: dict[str, None] = {}  # ordered set: tied names collapse to one entry
        for h in self.manifest.heads:
            names[h.embedding] = None
            names[h.unembedding] = None
        return list(names)

    def _load_backbone(self, tensors: dict[str, torch.Tensor]) -> None:
        sd = {
            k.removeprefix(BACKBONE_PREFIX): v
            for k, v in tensors.items()
            if k.startswith(BACKBONE_PREFIX)
        }
        expected = self.backbone.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        if missing or unexpected:
            what = f"missing {BACKBONE_PREFIX}{missing[0]}" if missing else (
                f"unexpected {BACKBONE_PREFIX}{unexpected[0]}"
            )
            raise CheckpointError(f"backbone tensors: {what}")
        for k, v in sd.items():
            if v.shape != expected[k].shape:
                raise CheckpointError(
                    f"tensor {BACKBONE_PREFIX}{k}: shape {tuple(v.shape)}, "
                    f"expected {tuple(expected[k].shape)}"
                )
        self.backbone.load_state_dict(sd, strict=True)

    def _check_matrices(self) -> None:
        d = self.manifest.backbone.hidden_size
        for h in self.manifest.heads:
            for name in (h.embedding, h.unembedding):
                m = self._matrix(name)
                if m.dim() != 2 or m.shape[1] != d:
                    raise CheckpointError(f"tensor {name!r}: shape {tuple(m.shape)}, need [V, {d}]")
                if m.shape[0] < h.vocab_size:
                    raise CheckpointError(
                        f"tensor {name!r}: {m.shape[0]} rows < head {h.name!r} V={h.vocab_size}"
                    )

    def _matrix(self, name: str) -> torch.Tensor:
        return getattr(self, self._matrix_attr[name])

    def _head(self, head_name: str) -> HeadSpec:
        try:
            return self.heads[head_name]
        except KeyError:
            raise KeyError(f"unknown head {head_name!r}; have {sorted(self.heads)}") from None

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def embed(self, head_name: str, ids: torch.Tensor) -> torch.Tensor:
        # ids: [T] int64 -> [T, d]
        h = self._head(head_name)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= h.vocab_size):
            raise ValueError(f"token ids outside [0, {h.vocab_size}) for head {head_name!r}")
        return self._matrix(h.embedding).index_select(0, ids)

    def unembedding_rows(self, head_name: str) -> torch.Tensor:
        # -> [V_h, d], a view of the (possibly shared) matrix
        h = self._head(head_name)
        return self._matrix(h.unembedding)[: h.vocab_size]

    def int8_prefix(self, rows: torch.Tensor) -> IntGroups | None:
        """The integer groups of `rows` [V, d] where they are the first V rows of a matrix whose
        groups the model holds (a nested head's rows are); None for any other tensor, such as
        a low-rank adapted head's folded copy."""
        for name, attr in self._matrix_attr.items():
            matrix = getattr(self, attr)
            if (name in self.int8 and rows.data_ptr() == matrix.data_ptr()
                    and rows.stride() == matrix.stride()):
                return self.int8[name].rows(0, rows.shape[0])
        return None

    def add_reading(self, name: str, head: str) -> None:
        """Serve `name` as a reading of the native head whose logits are `head`'s first V
        rows of it (heads/engine/grouped_reading.py adds the second level): it embeds and
        emits native ids, so its spec is the native head's under a new name."""
        self._head(head)
        if self._readings.get(name) == head:
            return  # registered already (engines built one after another on one model)
        if name in self.heads:
            raise ValueError(f"head {name!r} exists already")
        native = max(self.manifest.heads, key=lambda h: h.vocab_size)
        self.heads[name] = replace(native, name=name)
        self._readings[name] = head

    def head_output(self, head_name: str) -> HeadOutput:
        """What the head's logits come from: every logits path goes through this, so an
        adapted head is adapted everywhere. Unadapted: the shared rows, no bias. A reading
        (add_reading): its first level (reading_output)."""
        if head_name in self._readings:
            return self.reading_output(self._readings[head_name])
        return self._output(head_name, self.unembedding_rows(head_name))

    def reading_output(self, split_head: str) -> HeadOutput:
        """The first level of `split_head`'s two-level reading: its V rows of the native
        matrix, with the reading's adapter (HeadSpec.reading_adapter) when it has one."""
        return self._output(split_head + READING_SUFFIX, self.unembedding_rows(split_head))

    def _output(self, served: str, rows: torch.Tensor) -> HeadOutput:
        attrs = self._adapter_attr.get(served)
        if attrs is None:
            return HeadOutput(rows)

        def buf(role: str) -> torch.Tensor | None:
            return getattr(self, attrs[role]) if role in attrs else None

        weight = buf("weight")
        return HeadOutput(rows if weight is None else weight, buf("bias"), buf("down"),
                          buf("up"))

    def head_logits(self, head_name: str, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [N, d] final-normed -> [N, V_h] in hidden's dtype
        return self.head_output(head_name).logits(hidden)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, meta: StepMetadata, kv: KVCache
    ) -> torch.Tensor:
        # x: [T, d] input embeddings -> final-normed hidden states [T, d]
        return self.backbone(x, positions, meta, kv)

    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        out = {BACKBONE_PREFIX + k: v for k, v in self.backbone.state_dict().items()}
        out.update({name: self._matrix(name) for name in self._matrix_attr})
        return out

    @classmethod
    def random(cls, manifest: Manifest, seed: int, backbone_std: float = 0.02) -> MultiHeadModel:
        """Deterministic random weights: N(0, 0.02) matrices, N(0, backbone_std) projections,
        norms = 1. At 0.02 the residual stream is dominated by the input embedding and greedy
        decoding repeats the last token; a larger std gives varied, context-dependent text."""
        manifest.validate()
        gen = torch.Generator().manual_seed(seed)
        tensors: dict[str, torch.Tensor] = {}
        # Shapes come from a throwaway backbone so this stays architecture-agnostic.
        for k, v in sorted(build_backbone(manifest).state_dict().items()):
            if k.endswith("norm.weight"):
                tensors[BACKBONE_PREFIX + k] = torch.ones(v.shape)
            else:
                tensors[BACKBONE_PREFIX + k] = torch.randn(v.shape, generator=gen) * backbone_std
        rows: dict[str, int] = {}
        for h in manifest.heads:
            for name in (h.embedding, h.unembedding):
                rows[name] = max(rows.get(name, 0), h.vocab_size)
        d = manifest.backbone.hidden_size
        for name, v in rows.items():
            tensors[name] = torch.randn((v, d), generator=gen) * 0.02
        return cls(manifest, tensors)
