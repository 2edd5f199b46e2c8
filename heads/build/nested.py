"""Nested heads by vocabulary trimming: `polyhead heads build`.

From a checkpoint's native (largest) head: rank its tokens on a corpus (or read a saved
ranking), re-order the vocabulary into Matryoshka order, permute the rows of its embedding
and unembedding with the same permutation, trim the tokenizer for each smaller size, and
write one checkpoint whose heads all read prefixes of the one matrix.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from heads.build.ranking import Ranking, SourceWeights, load_ranking, rank_on_corpus, save_ranking
from heads.checkpoint import validate_checkpoint
from heads.data.files import GEMMA3_RANKING
from heads.errors import CheckpointError, TokenizerError
from heads.manifest import HeadSpec, Manifest
from heads.model.weights import load_int_groups, save_checkpoint
from heads.vocab.split_table import build_split_table
from heads.vocab.tokenizer import vocab_fingerprint
from heads.vocab.trimming import reorder_tokenizer, trim_tokenizer
from kernels.int_groups import IntGroups

log = logging.getLogger(__name__)

DEMO_SIZES = (32768, 131072)
# Above this many ids, reserved specials (Gemma-3 has 6k `<unusedN>`) go last by default.
SPECIALS_LAST_FROM_V = 65536
TRIMS = ("split", "merges")
# Special tokens a chat or a generation needs even when a corpus never shows them.
_CORE_SPECIAL = re.compile(
    r"<\|?(pad|unk|mask|bos|eos|s|/s|endoftext)\|?>|\[(PAD|UNK|CLS|SEP|MASK|BOS|EOS)\]"
    r"|<\|?((start|end)_of_turn|im_(start|end)|(start|end)_header_id|eot_id)\|?>"
)


def head_label(vocab_size: int) -> str:
    """Thousands, truncated, as the paper names heads: 32768 -> 32k, 131072 -> 131k."""
    return f"{vocab_size // 1000}k" if vocab_size >= 1000 else str(vocab_size)


def core_specials(tok: Tokenizer, manifest: Manifest, head: HeadSpec) -> set[str]:
    """Specials that stay first: BOS/EOS, pad/unk/mask, chat-turn markers, the template's."""
    d = json.loads(tok.to_str())
    ids = {*head.eos_token_ids, *(() if head.bos_token_id is None else (head.bos_token_id,))}
    template = manifest.chat_template or ""
    return {a["content"] for a in d["added_tokens"] if a["special"] and (
        a["id"] in ids or _CORE_SPECIAL.fullmatch(a["content"]) or a["content"] in template)}


def build_heads(
    src: Path,
    out: Path,
    sizes: list[int],
    corpus: list[Path] | None = None,
    ranking: Path | None = None,
    specials_last: bool | None = None,
    save_ranking_to: Path | None = None,
    weights: SourceWeights | None = None,
    trim: str = "split",
    spelling: str = "bpe",
) -> Manifest:
    """Write to `out` the native head of `src` plus one nested head per size.

    `trim` is how a smaller head spells text: "split" keeps the native segmentation and
    re-spells each removed token in kept ones (heads/vocab/split_table.py); "merges" filters the
    BPE merges, which can move the boundaries around a removed token. `spelling` is how a
    split head re-spells a removed token (see `build_split_table`).
    """
    if trim not in TRIMS:
        raise ValueError(f"trim must be one of {TRIMS}, not {trim!r}")
    if (corpus is None) == (ranking is None):
        raise ValueError("give exactly one of corpus files or a ranking file")
    manifest, native, tok, keep_first = _native_head(src, specials_last)
    if len(manifest.heads) > 1:
        log.warning("%s has %d heads; building from the native head %r only",
                    src, len(manifest.heads), native.name)
    v = native.vocab_size
    bad = [s for s in sizes if not 0 < s < v]
    if bad:
        raise ValueError(f"sizes must be in (0, {v}) (the native V); got {bad[0]}")

    if corpus is not None:
        rk = rank_on_corpus(tok, corpus, keep_first, weights)
        if save_ranking_to is not None:
            save_ranking(save_ranking_to, rk)
    else:
        assert ranking is not None
        rk = load_ranking(ranking)
        if rk.vocab_sha256 != vocab_fingerprint(tok):
            raise TokenizerError(f"{ranking}: ranked for another vocabulary than {src}")
    ordered, perm = reorder_tokenizer(tok, rk.order)
    new_of_old = np.empty(v, dtype=np.int64)
    new_of_old[perm] = np.arange(v)

    def remap(h: HeadSpec, name: str, size: int, tokenizer: str) -> HeadSpec:
        bos = None if h.bos_token_id is None else int(new_of_old[h.bos_token_id])
        return replace(h, name=name, vocab_size=size, tokenizer=tokenizer, bos_token_id=bos,
                       eos_token_ids=tuple(int(new_of_old[i]) for i in h.eos_token_ids),
                       bytes_per_token=None, bpb=None, encoder=None, split_table=None)

    native_file = f"tokenizers/{native.name}.json"
    fingerprint = vocab_fingerprint(ordered)
    heads: list[HeadSpec] = []
    files: dict[str, str | bytes] = {}
    for size in sorted(sizes):
        name = head_label(size)
        # The merge-filtered tokenizer is the head's tokenizer.json either way: standard
        # tools can load it, and its ids < V decode exactly as the native ones.
        trimmed = trim_tokenizer(ordered, size, keep_all_specials=keep_first is None)
        lost = sorted(t for t in keep_first or () if trimmed.token_to_id(t) is None)
        if lost:
            raise TokenizerError(f"head {name}: would lose special token {lost[0]!r}")
        files[f"tokenizers/{name}.json"] = trimmed.to_str()
        head = remap(native, name, size, f"tokenizers/{name}.json")
        if trim == "split":
            table = f"tokenizers/{name}.split.npz"
            files[table] = build_split_table(ordered, size, fingerprint, spelling,
                                             trimmed).to_bytes()
            head = replace(head, encoder=native_file, split_table=table)
        heads.append(head)
    files[native_file] = ordered.to_str()
    heads.append(remap(native, native.name, v, native_file))
    if len({h.name for h in heads}) != len(heads):
        raise ValueError(f"head names collide: {[h.name for h in heads]}")

    tensors = _permuted_tensors(src, manifest, native, torch.as_tensor(perm))
    extra = {**manifest.extra, "ranking": {"source": rk.source, "vocab_sha256": rk.vocab_sha256,
                                           "specials_last": keep_first is not None},
             "trim": trim, **({"spelling": spelling} if trim == "split" else {})}
    out_manifest = replace(manifest, heads=tuple(heads), extra=extra)
    save_checkpoint(out, out_manifest, tensors, files,
                    _permuted_int8(src, manifest, native, torch.as_tensor(perm)))
    return out_manifest


def _native_head(src: Path, specials_last: bool | None
                 ) -> tuple[Manifest, HeadSpec, Tokenizer, set[str] | None]:
    """The checkpoint's manifest, its native (largest) head and that head's tokenizer, and
    the specials that stay first when unused ones are ranked last (None: all stay first)."""
    manifest = validate_checkpoint(src)
    native = max(manifest.heads, key=lambda h: h.vocab_size)
    v = native.vocab_size
    tok = Tokenizer.from_file(str(src / native.tokenizer))
    if tok.get_vocab_size(with_added_tokens=True) != v:
        raise TokenizerError(f"native tokenizer has {tok.get_vocab_size()} ids, head V={v}")
    demote = v > SPECIALS_LAST_FROM_V if specials_last is None else specials_last
    return manifest, native, tok, core_specials(tok, manifest, native) if demote else None


def rank_checkpoint(src: Path, corpus: list[Path], weights: SourceWeights | None = None,
                    specials_last: bool | None = None) -> Ranking:
    """The Matryoshka order of the native head of `src`, ranked on `corpus`."""
    _, _, tok, keep_first = _native_head(src, specials_last)
    return rank_on_corpus(tok, corpus, keep_first, weights)


def _permuted_tensors(src: Path, manifest: Manifest, native: HeadSpec,
                      perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """All tensors of the source, with the native head's matrices in the new row order.

    Rows past V (if a matrix is larger than the vocabulary) stay where they are.
    """
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(src / manifest.weights), framework="pt") as f:
        for k in f.keys():  # noqa: SIM118
            tensors[k] = f.get_tensor(k)
    v = native.vocab_size
    for name in dict.fromkeys((native.embedding, native.unembedding)):
        w = tensors[name]
        if w.shape[0] < v:
            raise CheckpointError(f"tensor {name!r}: {w.shape[0]} rows < V={v}")
        tensors[name] = torch.cat((w[perm], w[v:])) if w.shape[0] > v else w[perm]
    return tensors


def _permuted_int8(src: Path, manifest: Manifest, native: HeadSpec,
                   perm: torch.Tensor) -> dict[str, IntGroups]:
    """The source's integer groups (where it has them), the native head's matrices in the new
    row order as in `_permuted_tensors`."""
    int8 = load_int_groups(src, manifest)
    v = native.vocab_size
    for name in dict.fromkeys((native.embedding, native.unembedding)):
        if name in int8:
            g = int8[name]
            index = torch.cat((perm, torch.arange(v, g.shape[0]))) if g.shape[0] > v else perm
            int8[name] = g.take(index)
    return int8


def build_demo_heads(src: Path, out: Path) -> Manifest:
    """The 3-head Gemma-3 demo from a single-head checkpoint, using the committed ranking
    (no corpus needed): 32k and 131k nested heads plus the native 262k."""
    return build_heads(src, out, list(DEMO_SIZES), ranking=GEMMA3_RANKING)
