"""Nested heads by vocabulary trimming: `polyhead heads build`.

From a checkpoint's native (largest) head: rank its tokens on a corpus (or read a saved
ranking), re-order the vocabulary into Matryoshka order, permute the rows of its embedding
and unembedding with the same permutation, trim the tokenizer for each smaller size, and
write one checkpoint whose heads all read prefixes of the one matrix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from heads.checkpoint import save_checkpoint, validate_checkpoint
from heads.corpus import read_documents
from heads.errors import CheckpointError, TokenizerError
from heads.manifest import HeadSpec, Manifest
from heads.trimming import count_tokens, rank_tokens, reorder_tokenizer, trim_tokenizer

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent / "data"
# Token order of the Gemma-3 vocabulary, ranked on the train split of the default corpus.
GEMMA3_RANKING = DATA_DIR / "gemma3-ranking.npz"
DEMO_SIZES = (32768, 131072)
# Above this many ids, reserved specials (Gemma-3 has 6k `<unusedN>`) go last by default.
SPECIALS_LAST_FROM_V = 65536
# Special tokens a chat or a generation needs even when a corpus never shows them.
_CORE_SPECIAL = re.compile(
    r"<\|?(pad|unk|mask|bos|eos|s|/s|endoftext)\|?>|\[(PAD|UNK|CLS|SEP|MASK|BOS|EOS)\]"
    r"|<\|?((start|end)_of_turn|im_(start|end)|(start|end)_header_id|eot_id)\|?>"
)


@dataclass(frozen=True, slots=True)
class Ranking:
    order: list[int]  # old ids in Matryoshka order
    vocab_sha256: str  # of the tokenizer the order was ranked for
    source: str  # what it was ranked on


def head_label(vocab_size: int) -> str:
    """Thousands, truncated, as the paper names heads: 32768 -> 32k, 131072 -> 131k."""
    return f"{vocab_size // 1000}k" if vocab_size >= 1000 else str(vocab_size)


def vocab_fingerprint(tok: Tokenizer) -> str:
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    return hashlib.sha256("\0".join(t for t, _ in by_id).encode()).hexdigest()


def core_specials(tok: Tokenizer, manifest: Manifest, head: HeadSpec) -> set[str]:
    """Specials that stay first: BOS/EOS, pad/unk/mask, chat-turn markers, the template's."""
    d = json.loads(tok.to_str())
    ids = {*head.eos_token_ids, *(() if head.bos_token_id is None else (head.bos_token_id,))}
    template = manifest.chat_template or ""
    return {a["content"] for a in d["added_tokens"] if a["special"] and (
        a["id"] in ids or _CORE_SPECIAL.fullmatch(a["content"]) or a["content"] in template)}


def rank_on_corpus(tok: Tokenizer, files: list[Path], keep_first: set[str] | None) -> Ranking:
    counts: Counter[int] = Counter()
    for path in files:
        counts.update(count_tokens(tok, read_documents(path)))
        log.info("counted %s: %d distinct tokens so far", path.name, len(counts))
    order = rank_tokens(tok, counts, keep_first=keep_first)
    return Ranking(order, vocab_fingerprint(tok), ", ".join(p.name for p in files))


def save_ranking(path: Path, ranking: Ranking) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:  # np.savez_compressed would append .npz to a str path
        np.savez_compressed(f, order=np.asarray(ranking.order, dtype=np.int32),
                            vocab_sha256=np.asarray(ranking.vocab_sha256),
                            source=np.asarray(ranking.source))


def load_ranking(path: Path) -> Ranking:
    try:
        with np.load(path, allow_pickle=False) as z:
            return Ranking(z["order"].astype(np.int64).tolist(), str(z["vocab_sha256"]),
                           str(z["source"]))
    except (OSError, KeyError, ValueError) as e:
        raise TokenizerError(f"{path}: not a token ranking file ({e})") from e


def build_heads(
    src: Path,
    out: Path,
    sizes: list[int],
    corpus: list[Path] | None = None,
    ranking: Path | None = None,
    specials_last: bool | None = None,
    save_ranking_to: Path | None = None,
) -> Manifest:
    """Write to `out` the native head of `src` plus one nested head per size."""
    if (corpus is None) == (ranking is None):
        raise ValueError("give exactly one of corpus files or a ranking file")
    manifest = validate_checkpoint(src)
    native = max(manifest.heads, key=lambda h: h.vocab_size)
    if len(manifest.heads) > 1:
        log.warning("%s has %d heads; building from the native head %r only",
                    src, len(manifest.heads), native.name)
    v = native.vocab_size
    bad = [s for s in sizes if not 0 < s < v]
    if bad:
        raise ValueError(f"sizes must be in (0, {v}) (the native V); got {bad[0]}")
    tok = Tokenizer.from_file(str(src / native.tokenizer))
    if tok.get_vocab_size(with_added_tokens=True) != v:
        raise TokenizerError(f"native tokenizer has {tok.get_vocab_size()} ids, head V={v}")
    demote = v > SPECIALS_LAST_FROM_V if specials_last is None else specials_last
    keep_first = core_specials(tok, manifest, native) if demote else None

    if corpus is not None:
        rk = rank_on_corpus(tok, corpus, keep_first)
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
                       bytes_per_token=None, bpb=None)

    heads, files = [], {}
    for size in sorted(sizes):
        name = head_label(size)
        trimmed = trim_tokenizer(ordered, size, keep_all_specials=keep_first is None)
        lost = sorted(t for t in keep_first or () if trimmed.token_to_id(t) is None)
        if lost:
            raise TokenizerError(f"head {name}: would lose special token {lost[0]!r}")
        files[f"tokenizers/{name}.json"] = trimmed.to_str()
        heads.append(remap(native, name, size, f"tokenizers/{name}.json"))
    files[f"tokenizers/{native.name}.json"] = ordered.to_str()
    heads.append(remap(native, native.name, v, f"tokenizers/{native.name}.json"))
    if len({h.name for h in heads}) != len(heads):
        raise ValueError(f"head names collide: {[h.name for h in heads]}")

    tensors = _permuted_tensors(src, manifest, native, torch.as_tensor(perm))
    extra = {**manifest.extra, "ranking": {"source": rk.source, "vocab_sha256": rk.vocab_sha256,
                                           "specials_last": keep_first is not None}}
    out_manifest = replace(manifest, heads=tuple(heads), extra=extra)
    save_checkpoint(out, out_manifest, tensors, files)
    return out_manifest


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


def build_demo_heads(src: Path, out: Path) -> Manifest:
    """The 3-head Gemma-3 demo from a single-head checkpoint, using the committed ranking
    (no corpus needed): 32k and 131k nested heads plus the native 262k."""
    return build_heads(src, out, list(DEMO_SIZES), ranking=GEMMA3_RANKING)
