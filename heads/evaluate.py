"""Per-head measurement on held-out text: `polyhead heads eval`.

For each head and source file: bytes/token, bits per byte (BPB) with that head's tokenizer
and its logits restricted to its V, prefill tokens/s, and the fraction of tokens not in the
native head's segmentation. BPB is computed over windows of `window` tokens, each prefixed
with BOS, through the backbone directly (no engine): the sum of -log2 p(token) over every
text token, divided by the text's UTF-8 bytes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from heads.attention import AttentionMetadata, allocate_kv_cache
from heads.checkpoint import Checkpoint, load_checkpoint
from heads.corpus import read_documents, source_name
from heads.manifest import MANIFEST_FILE

log = logging.getLogger(__name__)

AGGREGATE = "all"


@dataclass(frozen=True, slots=True)
class HeadSourceResult:
    head: str
    vocab_size: int
    source: str
    bytes: int  # UTF-8 bytes of the evaluated text
    tokens: int
    bits: float  # sum of -log2 p over the tokens
    prefill_seconds: float
    differing_tokens: int  # tokens whose byte span is not a token of the native head

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens

    @property
    def bpb(self) -> float:
        return self.bits / self.bytes

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.tokens / self.prefill_seconds if self.prefill_seconds else math.nan

    @property
    def differing_fraction(self) -> float:
        return self.differing_tokens / self.tokens

    def row(self) -> dict:
        return {**asdict(self), "bytes_per_token": self.bytes_per_token, "bpb": self.bpb,
                "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "differing_fraction": self.differing_fraction}


@torch.inference_mode()
def forward_hidden(ckpt: Checkpoint, head: str, ids: list[int]) -> torch.Tensor:
    """Final hidden states [T, d] for one sequence starting at position 0 (fresh KV cache)."""
    model = ckpt.model
    b = ckpt.manifest.backbone
    block = 16
    t = len(ids)
    kv = allocate_kv_cache(b.num_layers, -(-t // block), block, b.num_kv_heads, b.head_dim,
                           model.dtype, model.device)
    x = torch.tensor(ids, dtype=torch.int64, device=model.device)
    positions = torch.arange(t, device=model.device)
    meta = AttentionMetadata.prefill([t], positions.clone())  # slot i holds position i
    return model(model.embed(head, x), positions, meta, kv)


def forward_logits(ckpt: Checkpoint, head: str, ids: list[int]) -> torch.Tensor:
    # -> [T, V_head] fp32
    w = ckpt.model.unembedding_rows(head).float()
    return forward_hidden(ckpt, head, ids).float() @ w.T


@torch.inference_mode()
def sequence_bits(ckpt: Checkpoint, head: str, ids: list[int], window: int,
                  w32: torch.Tensor | None = None) -> tuple[float, float]:
    """(sum of -log2 p(token | context) over the ids, seconds in the backbone), in windows
    of `window` tokens; the second is the prefill time (logits excluded).

    With a BOS id every window starts with BOS and all ids are scored; without one, windows
    overlap by one token and the first id (which has no context) is not scored. `w32` is the
    head's unembedding in fp32 [V, d]: logits in the checkpoint dtype (bf16) would round by
    ~0.1 nats at logit magnitudes around 30.
    """
    bos = ckpt.manifest.head(head).bos_token_id
    w = ckpt.model.unembedding_rows(head).float() if w32 is None else w32
    if bos is not None:
        contexts = [[bos, *ids[i:i + window - 1]] for i in range(0, len(ids), window - 1)]
    else:
        contexts = [ids[i:i + window] for i in range(0, max(len(ids) - 1, 0), window - 1)]
    nats, seconds = 0.0, 0.0
    for ctx in contexts:
        t0 = time.perf_counter()
        hidden = forward_hidden(ckpt, head, ctx)[:-1].float()  # predicts ctx[1:]
        seconds += time.perf_counter() - t0
        target = torch.tensor(ctx[1:], device=hidden.device)
        for r in range(0, hidden.shape[0], 128):  # [128, V] fp32 logits at a time
            logits = hidden[r:r + 128] @ w.T
            nats += float(F.cross_entropy(logits, target[r:r + 128], reduction="sum"))
    return nats / math.log(2), seconds


def _plain(tok: Tokenizer) -> Tokenizer:
    plain = Tokenizer.from_str(tok.to_str())
    plain.encode_special_tokens = True  # corpus text is untrusted text, as at serving time
    return plain


def _spans(text: str, tok: Tokenizer) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, enc.offsets


def evaluate(ckpt: Checkpoint, files: list[Path], max_bytes: int, window: int
             ) -> list[HeadSourceResult]:
    heads = sorted(ckpt.manifest.heads, key=lambda h: h.vocab_size)
    native = heads[-1].name
    plain = {h.name: _plain(ckpt.tokenizers[h.name].tokenizer) for h in heads}
    full = ckpt.model.unembedding_rows(native).float()  # nested heads read a prefix of it
    w32 = {h.name: (full[:h.vocab_size] if ckpt.manifest.head(h.name).unembedding
                    == ckpt.manifest.head(native).unembedding
                    else ckpt.model.unembedding_rows(h.name).float()) for h in heads}
    results = []
    for path in files:
        text = _head_of(path, max_bytes)
        n_bytes = len(text.encode())
        native_spans = set(_spans(text, plain[native])[1])
        for h in heads:
            ids, offsets = _spans(text, plain[h.name])
            bits, dt = sequence_bits(ckpt, h.name, ids, window, w32[h.name])
            differ = sum(o not in native_spans for o in offsets)
            r = HeadSourceResult(h.name, h.vocab_size, source_name(path), n_bytes, len(ids),
                                 bits, dt, differ)
            log.info("%s %s: %.3f bytes/token, %.4f BPB, %.0f tok/s", h.name, r.source,
                     r.bytes_per_token, r.bpb, r.prefill_tokens_per_s)
            results.append(r)
    return results


def _head_of(path: Path, max_bytes: int) -> str:
    """Whole documents from the start of the file, up to max_bytes of UTF-8."""
    out: list[str] = []
    size = 0
    for doc in read_documents(path):
        n = len(doc.encode()) + 2
        if out and size + n > max_bytes:
            break
        out.append(doc)
        size += n
    return "\n\n".join(out)


def aggregate(results: list[HeadSourceResult]) -> list[HeadSourceResult]:
    """Per head, the sum over sources (BPB and bytes/token of the held-out aggregate)."""
    out = []
    for head in dict.fromkeys(r.head for r in results):
        rs = [r for r in results if r.head == head]
        out.append(HeadSourceResult(
            head, rs[0].vocab_size, AGGREGATE, sum(r.bytes for r in rs),
            sum(r.tokens for r in rs), sum(r.bits for r in rs),
            sum(r.prefill_seconds for r in rs), sum(r.differing_tokens for r in rs)))
    return out


def write_results(ckpt: Checkpoint, results: list[HeadSourceResult], out: Path) -> Path:
    """Record the aggregate in the manifest (atomically) and write eval.json + eval.png."""
    totals = {r.head: r for r in aggregate(results)}
    heads = tuple(replace(h, bytes_per_token=round(totals[h.name].bytes_per_token, 4),
                          bpb=round(totals[h.name].bpb, 4)) for h in ckpt.manifest.heads)
    sources = sorted({r.source for r in results})
    manifest = replace(ckpt.manifest, heads=heads,
                       extra={**ckpt.manifest.extra, "eval_sources": sources})
    manifest.validate()
    tmp = ckpt.directory / f".{MANIFEST_FILE}.tmp"
    tmp.write_text(manifest.to_json())
    os.replace(tmp, ckpt.directory / MANIFEST_FILE)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for r in [*results, *totals.values()]]
    (out / "eval.json").write_text(json.dumps(rows, indent=2) + "\n")
    png = out / "eval.png"
    plot(results, png)
    return png


def plot(results: list[HeadSourceResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    all_rows = [*results, *aggregate(results)]
    for source in dict.fromkeys(r.source for r in all_rows):
        rs = sorted((r for r in all_rows if r.source == source), key=lambda r: r.vocab_size)
        style = {"linewidth": 2.5, "color": "black"} if source == AGGREGATE else {}
        vs = [r.vocab_size for r in rs]
        axes[0].plot(vs, [r.bytes_per_token for r in rs], marker="o", label=source, **style)
        axes[1].plot(vs, [r.bpb for r in rs], marker="o", label=source, **style)
    for ax, ylabel in zip(axes, ("bytes / token", "bits / byte"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("head vocabulary size V")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle("per-head compression and BPB on held-out text")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_eval(model_dir: Path, files: list[Path], max_bytes: int, window: int,
             out: Path | None = None, compute_dtype: str | None = None
             ) -> tuple[list[HeadSourceResult], Path]:
    """`compute_dtype` (e.g. "float32") runs the weights upcast: on CPUs without bf16 matmul
    units it is faster than bfloat16 (2.6x for Gemma-3-270M on 2 cores), and no less exact."""
    ckpt = load_checkpoint(model_dir, compute_dtype=compute_dtype)
    results = evaluate(ckpt, files, max_bytes, window)
    png = write_results(ckpt, results, out or model_dir / "eval")
    return results, png
