"""manifest.json of a polyhead checkpoint: backbone config, dtype and the list of heads.

Nested heads share one matrix: head h uses rows [0, rows_h) of the tensor named by
`unembedding` (Matryoshka order), so the smaller heads cost no extra weights.

A trimmed head can carry a small learned correction on top of the shared, untouched matrix,
recorded as `HeadSpec.adapter` (`AdapterSpec`):

- `lowrank`: logits = (W + A B) h + b, with A [V, r] and B [r, d];
- `hidden`:  logits = W (h + U (D h)) + b, with D [r, d] and U [d, r].

W is the head's rows [0, V) of the shared matrix and h its final-normed hidden state [d].
The tensors (fp32, a few MB per head) live in a sidecar safetensors file of their own, so
adapting never rewrites the shared weights: the new file is written first and the manifest
that names it replaces the old one atomically.
The native (largest) head is never adapted: it is the teacher the others are fitted to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from heads.errors import CheckpointError

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
ARCHITECTURES = ("llama", "gemma3")
DTYPES = ("float32", "bfloat16", "float16")
LAYER_TYPES = ("sliding_attention", "full_attention")
# Adapter kinds and the names of their tensors (after the head's prefix).
ADAPTER_KINDS = ("lowrank", "hidden")
BIAS = "bias"  # [V]
LOWRANK_A, LOWRANK_B = "a", "b"  # [V, r], [r, d]
HIDDEN_DOWN, HIDDEN_UP = "down", "up"  # [r, d], [d, r]


@dataclass(frozen=True, slots=True)
class BackboneConfig:
    architecture: str
    hidden_size: int  # d
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0  # global (full-attention) layers
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    # Gemma-3 only; the defaults keep Llama manifests unchanged.
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included
    layer_types: tuple[str, ...] = ()  # per layer, one of LAYER_TYPES; () = all full attention
    rope_local_theta: float | None = None  # RoPE base of sliding layers; None = rope_theta
    rope_linear_factor: float | None = None  # linear RoPE scaling of full-attention layers
    query_pre_attn_scalar: float | None = None  # scores scale by its -1/2; None = head_dim
    final_logit_softcapping: float | None = None

    def validate(self, where: str) -> None:
        if self.architecture not in ARCHITECTURES:
            raise CheckpointError(f"{where}.architecture: unknown {self.architecture!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise CheckpointError(f"{where}.{name}: must be > 0")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"{where}.num_kv_heads: must divide num_heads")
        for name in ("sliding_window", "rope_local_theta", "rope_linear_factor",
                     "query_pre_attn_scalar", "final_logit_softcapping"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise CheckpointError(f"{where}.{name}: must be > 0 or null")
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise CheckpointError(f"{where}.layer_types: need one entry per layer")
            bad = [t for t in self.layer_types if t not in LAYER_TYPES]
            if bad:
                raise CheckpointError(f"{where}.layer_types: {bad[0]!r} not in {LAYER_TYPES}")
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise CheckpointError(f"{where}.sliding_window: sliding layers need a window")

    @property
    def kv_bytes_per_token_per_elem(self) -> int:
        """K and V elements per token over all layers; multiply by the dtype size for bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Backbone parameters without embeddings (attention, MLP, norms)."""
        d, h = self.hidden_size, self.head_dim
        attn = d * h * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * d * self.intermediate_size
        return self.num_layers * (attn + mlp + 2 * d) + d


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    kind: str  # one of ADAPTER_KINDS
    rank: int  # r
    prefix: str  # tensor names are prefix + BIAS, LOWRANK_A, ...
    file: str  # safetensors file holding them, relative to the checkpoint directory
    steps: int = 0  # optimizer steps the stored tensors come from (the best held-out BPB)
    data: tuple[str, ...] = ()  # training sources (corpus file names)
    train_positions: int = 0  # scored positions in the training set
    heldout_bpb_before: float | None = None  # held-out BPB of the head without the adapter
    heldout_bpb_after: float | None = None  # and with it; same text, same byte windows

    def validate(self, where: str) -> None:
        if self.kind not in ADAPTER_KINDS:
            raise CheckpointError(f"{where}.kind: {self.kind!r} not in {ADAPTER_KINDS}")
        if self.rank <= 0:
            raise CheckpointError(f"{where}.rank: must be > 0")
        if not self.prefix:
            raise CheckpointError(f"{where}.prefix: must be non-empty")
        if not self.file.endswith(".safetensors") or ".." in self.file.split("/"):
            raise CheckpointError(f"{where}.file: need a .safetensors path inside the "
                                  f"checkpoint, got {self.file!r}")
        if self.steps < 0 or self.train_positions < 0:
            raise CheckpointError(f"{where}: steps and train_positions must be >= 0")

    def shapes(self, vocab_size: int, hidden_size: int) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape, for a head of `vocab_size` rows and hidden size d."""
        v, d, r = vocab_size, hidden_size, self.rank
        mats = ({LOWRANK_A: (v, r), LOWRANK_B: (r, d)} if self.kind == "lowrank"
                else {HIDDEN_DOWN: (r, d), HIDDEN_UP: (d, r)})
        return {self.prefix + k: s for k, s in {BIAS: (v,), **mats}.items()}

    def names(self) -> list[str]:
        return list(self.shapes(1, 1))


@dataclass(frozen=True, slots=True)
class PenaltySpec:
    """The head's fitted per-request BPB penalty: predicted BPB ÷ native BPB − 1 =
    per_split · split share + per_fallback_share · byte-token share of the bytes, fitted
    when the checkpoint was built on its evaluation per language (router.segmentation; the
    router's quality bound reads it; the native head's is 0, 0: it is the reference).
    Stored in `Manifest.extra[PENALTY_KEY][head]`."""

    per_split: float
    per_fallback_share: float
    mean_abs_error: float = 0.0  # of the fit on its own points
    points: int = 0  # languages it was fitted on
    sources: tuple[str, ...] = ()  # the evaluated samples
    # The smallest split share the head showed on them: what a short prompt's own share is
    # shrunk towards. None: fitted before polyhead stored it (refitted on load).
    prior_split: float | None = None
    # A two-level reading's: native rows its second level reads per token of the evaluated
    # text (the sampled piece's group where it has more than one member); None otherwise.
    group_rows: float | None = None

    def validate(self, where: str) -> None:
        if self.per_split < 0 or self.per_fallback_share < 0 or (self.prior_split or 0) < 0:
            raise CheckpointError(f"{where}: penalty coefficients must be >= 0")


def default_prefix(head: str) -> str:
    return f"adapters.{head}."


def folded_rows_name(spec: AdapterSpec) -> str:
    """The name an export gives a low-rank head's folded rows W + A B [V, d]."""
    return spec.prefix + "rows"


@dataclass(frozen=True, slots=True)
class HeadSpec:
    name: str  # short label used in "model:head", e.g. "4k"
    vocab_size: int  # V: rows of the shared matrices this head uses
    tokenizer: str  # tokenizer.json path, relative to the checkpoint directory
    embedding: str  # safetensors tensor holding the input embedding rows
    unembedding: str  # safetensors tensor holding the output rows (same name when tied)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    training_bytes: int  # bytes of text the head was trained on; the denominator of λ
    bytes_per_token: float | None = None  # measured on held-out text; None until measured
    bpb: float | None = None  # bits per byte on held-out text; None until measured
    # Whether the head's training cost is paid. Heads trimmed from a trained head are: they
    # reuse its rows and the backbone's one training run. A head still to be trained or
    # adapted is not, and the lifecycle policy then charges its C_train against λ.
    training_sunk: bool = True
    # A boundary-preserving head: the tokenizer.json it encodes with (the native head's) and
    # the split table (.npz) that re-spells the native ids outside this head in its own;
    # `tokenizer` then only decodes. Both None for a head that encodes with `tokenizer`.
    encoder: str | None = None
    split_table: str | None = None
    # A learned output correction on top of the shared rows (AdapterSpec above).
    adapter: AdapterSpec | None = None
    # A two-level reading of this split head (heads/vocab/piece_groups.py), named
    # `<reads>` + READING_SUFFIX: it encodes, embeds and emits native ids and its logits
    # are the split head's V rows, then the sampled piece's group. Never stored in a
    # checkpoint: `Manifest.with_readings` adds it for serving.
    reads: str | None = None
    # A learned correction of this split head's reading's first level (its V rows, read
    # over native context); the second level stays the native rows. Hidden or low-rank
    # like `adapter`, with V = this head's.
    reading_adapter: AdapterSpec | None = None

    def validate(self, where: str) -> None:
        if not self.name or ":" in self.name:
            raise CheckpointError(f"{where}.name: must be non-empty and contain no ':'")
        if (self.encoder is None) != (self.split_table is None):
            raise CheckpointError(f"{where}: encoder and split_table go together")
        if self.vocab_size <= 0:
            raise CheckpointError(f"{where}.vocab_size: must be > 0")
        bos = () if self.bos_token_id is None else (self.bos_token_id,)
        specials = (*self.eos_token_ids, *bos)
        for tid in specials:
            if not 0 <= tid < self.vocab_size:
                raise CheckpointError(
                    f"{where}: special token id {tid} outside [0, {self.vocab_size})"
                )
        if not self.eos_token_ids:
            raise CheckpointError(f"{where}.eos_token_ids: at least one EOS id is required")
        if self.training_bytes < 0:
            raise CheckpointError(f"{where}.training_bytes: must be >= 0")
        if self.adapter is not None:
            self.adapter.validate(f"{where}.adapter")
        if self.reading_adapter is not None:
            if self.split_table is None:
                raise CheckpointError(f"{where}.reading_adapter: only a split head has a "
                                      "two-level reading")
            self.reading_adapter.validate(f"{where}.reading_adapter")

    def adapters(self) -> list[tuple[str, AdapterSpec]]:
        """(served head, adapter) for this head's own adapter and its reading's."""
        return [(name, a) for name, a in ((self.name, self.adapter),
                                          (self.name + READING_SUFFIX, self.reading_adapter))
                if a is not None]


@dataclass(frozen=True, slots=True)
class Manifest:
    model_name: str
    dtype: str
    backbone: BackboneConfig
    heads: tuple[HeadSpec, ...]
    weights: str = "model.safetensors"
    chat_template: str | None = None  # jinja2; None selects the documented plain template
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def head(self, name: str) -> HeadSpec:
        for h in self.heads:
            if h.name == name:
                return h
        raise KeyError(name)

    def penalty(self, name: str) -> PenaltySpec | None:
        """Head `name`'s fitted BPB penalty (extra[PENALTY_KEY]); None when not fitted."""
        table = self.extra.get(PENALTY_KEY, {})
        if not isinstance(table, dict):
            raise CheckpointError(f"extra.{PENALTY_KEY}: expected an object of heads")
        raw = table.get(name)
        if raw is None:
            return None
        spec = _build(PenaltySpec, raw, f"extra.{PENALTY_KEY}.{name}")
        spec.validate(f"extra.{PENALTY_KEY}.{name}")
        return spec

    def with_readings(self, heads: Sequence[str]) -> Manifest:
        """A copy that also serves each named split head's two-level reading as a head of
        its own, after the heads it reads (HeadSpec.reads)."""
        native = self.native
        readable = set(self.readings.values())
        for name in heads:
            if name not in readable:
                raise CheckpointError(
                    f"head {name!r} has no two-level reading: only a split head nested in the "
                    f"native head's rows has one (here: {', '.join(sorted(readable)) or 'none'})")
        added = [replace(native, name=name + READING_SUFFIX, reads=name, bpb=None)
                 for name in heads]
        return replace(self, heads=(*self.heads, *added))

    @property
    def native(self) -> HeadSpec:
        """The reference head: the largest one that is not a two-level reading (a reading
        has the native V too, as it emits native ids)."""
        return max((h for h in self.heads if h.reads is None), key=lambda h: h.vocab_size)

    @property
    def readings(self) -> dict[str, str]:
        """reading name -> split head, for every split head nested in the native head's
        rows (each has a two-level reading; with_readings serves it)."""
        native = self.native
        return {h.name + READING_SUFFIX: h.name for h in self.heads
                if h.split_table is not None and h.reads is None
                and h.unembedding == native.unembedding}

    def with_penalties(self, fits: dict[str, PenaltySpec]) -> Manifest:
        """A copy with these heads' fits stored (others kept)."""
        known = dict(self.extra.get(PENALTY_KEY, {}))
        known.update({h: asdict(f) for h, f in fits.items()})
        return replace(self, extra={**self.extra, PENALTY_KEY: known})

    @property
    def head_names(self) -> list[str]:
        return [h.name for h in self.heads]

    def validate(self) -> None:
        if self.format_version != FORMAT_VERSION:
            raise CheckpointError(
                f"format_version: {self.format_version} is not supported "
                f"(expected {FORMAT_VERSION})"
            )
        if not self.model_name or ":" in self.model_name:
            raise CheckpointError("model_name: must be non-empty and contain no ':'")
        if self.dtype not in DTYPES:
            raise CheckpointError(f"dtype: {self.dtype!r} not in {DTYPES}")
        self.backbone.validate("backbone")
        if not self.heads:
            raise CheckpointError("heads: at least one head is required")
        names = [h.name for h in self.heads]
        if len(set(names)) != len(names):
            raise CheckpointError("heads: head names must be unique")
        for i, h in enumerate(self.heads):
            h.validate(f"heads[{i}]")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    def save(self, directory: Path) -> None:
        # Temp file + rename: a reader never sees a half-written manifest.
        tmp = directory / f".{MANIFEST_FILE}.tmp"
        tmp.write_text(self.to_json())
        tmp.replace(directory / MANIFEST_FILE)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> Manifest:
        m = Manifest(
            model_name=_take(raw, "model_name", str),
            dtype=_take(raw, "dtype", str),
            backbone=_build(BackboneConfig, _take(raw, "backbone", dict), "backbone"),
            heads=tuple(
                _build(HeadSpec, h, f"heads[{i}]")
                for i, h in enumerate(_take(raw, "heads", list))
            ),
            weights=raw.get("weights", "model.safetensors"),
            chat_template=raw.get("chat_template"),
            format_version=_take(raw, "format_version", int),
            extra=raw.get("extra", {}),
        )
        m.validate()
        for name in (*m.head_names, *m.readings):  # a malformed fit fails at load
            m.penalty(name)
        return m

    @staticmethod
    def load(directory: Path) -> Manifest:
        path = directory / MANIFEST_FILE
        if not directory.is_dir():
            raise CheckpointError(f"model directory {directory} does not exist")
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (not a polyhead checkpoint)")
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: top level must be an object")
        return Manifest.from_dict(raw)


def _take(raw: dict[str, Any], key: str, kind: type) -> Any:
    if key not in raw:
        raise CheckpointError(f"{key}: missing")
    value = raw[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointError(f"{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _build(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: expected an object")
    known = {f.name: f for f in fields(cls)}
    unknown = set(raw) - set(known)
    if unknown:
        raise CheckpointError(f"{where}.{sorted(unknown)[0]}: unknown field")
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        if name not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                raise CheckpointError(f"{where}.{name}: missing")
            continue
        kwargs[name] = _check_type(raw[name], str(f.type), f"{where}.{name}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise CheckpointError(f"{where}: {e}") from e


_RECORDS: dict[str, type] = {"AdapterSpec": AdapterSpec, "PenaltySpec": PenaltySpec}
# extra[PENALTY_KEY]: head -> PenaltySpec fields. In `extra`, not in the head records, so a
# polyhead that predates the fit still reads the manifest (it ignores what it does not know).
PENALTY_KEY = "bpb_penalty"
READING_SUFFIX = "+groups"  # a split head's two-level reading: `<head>+groups`
_SCALARS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,)}


def _check_type(value: Any, annotation: str, where: str) -> Any:
    # Annotations are strings here (PEP 563); only the shapes used in this file are handled.
    optional = annotation.endswith("| None")
    base = annotation.removesuffix("| None").strip()
    if value is None:
        if optional:
            return None
        raise CheckpointError(f"{where}: must not be null")
    if base.startswith("tuple["):
        item, label = ((str,), "strings") if base.startswith("tuple[str") else ((int,), "integers")
        if not isinstance(value, list) or not all(_is(v, item) for v in value):
            raise CheckpointError(f"{where}: expected a list of {label}")
        return tuple(value)
    if base in _RECORDS:  # a nested record: built and checked field by field
        return _build(_RECORDS[base], value, where)
    if base == "bool":
        if not isinstance(value, bool):
            raise CheckpointError(f"{where}: expected true or false, got {type(value).__name__}")
        return value
    kinds = _SCALARS.get(base)
    if kinds is not None and not _is(value, kinds):
        raise CheckpointError(f"{where}: expected {base}, got {type(value).__name__}")
    return value


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not isinstance(value, bool)
