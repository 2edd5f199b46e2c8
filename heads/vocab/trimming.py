"""Vocabulary trimming into Matryoshka order, for nested heads that share embedding rows.

Works on the tokenizer JSON of any BPE whose strings all round-trip through a fixed base:
byte-level BPE (GPT-2, Llama-3: the 256 byte symbols) and SentencePiece-style BPE with
byte fallback (Gemma: the 256 `<0xXX>` tokens). In Matryoshka order every prefix of the ids
is closed under merge ancestry and holds the specials and the base, so any prefix is a
vocabulary on which decode(encode(x)) is unchanged.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from tokenizers import Tokenizer

from heads.errors import TokenizerError

log = logging.getLogger(__name__)

Merge = tuple[str, str]


def count_tokens(tokenizer: Tokenizer, texts: Iterable[str]) -> Counter[int]:
    """How often each id occurs when the texts are encoded (special-token text is matched)."""
    d = _load(tokenizer)
    counter = Tokenizer.from_str(json.dumps({**d, "truncation": None, "padding": None}))
    counts: Counter[int] = Counter()
    for enc in counter.encode_batch_fast(list(texts), add_special_tokens=False):
        counts.update(enc.ids)
    return counts


def rank_tokens(
    tokenizer: Tokenizer,
    texts: Iterable[str] | Mapping[int, float],
    keep_first: Collection[str] | None = None,
) -> list[int]:
    """Old ids in Matryoshka order: specials, base alphabet, whitespace runs, then by corpus
    frequency.

    Frequency ties go to the lower merge rank (base-like tokens, made by no merge, first).
    Each token is preceded by the parents of the first merge that makes it, recursively.
    `texts` may be counts or weighted frequencies per id instead (`count_tokens`).
    Tokens spelling only whitespace (paragraph breaks, runs of spaces or tabs) come right after the
    base, whatever their count: a trimmed head that spelled a paragraph break in two tokens
    would show the model a segmentation it never saw, in every multi-paragraph text.

    With `keep_first`, only the specials it names and those seen in the texts lead; the
    other special tokens (reserved `<unusedN>` and the like) go last, after every ordinary
    token, so small heads are not filled with ids the text never uses. Trim such an order
    with `trim_tokenizer(..., keep_all_specials=False)`.
    """
    d = _load(tokenizer)
    tokens = _id_to_token(d)
    vocab = d["model"]["vocab"]
    producer = _producers(d)
    counts: Mapping[int, float] = (texts if isinstance(texts, Mapping)
                                   else count_tokens(tokenizer, texts))

    # Specials and the base are roots: placed as they are, never via ancestry.
    specials = [a for a in sorted(d["added_tokens"], key=lambda a: a["id"]) if a["special"]]
    base = [vocab[t] for t in _base_tokens(d)]
    last: list[int] = []
    if keep_first is not None:
        last = [a["id"] for a in specials if a["content"] not in keep_first
                and not counts.get(a["id"], 0) and a["id"] not in base]
    demoted = set(last)
    roots = [a["id"] for a in specials if a["id"] not in demoted]
    order = list(dict.fromkeys(roots + base))
    placed = set(order) | demoted

    def key(i: int) -> tuple[float, int, int]:
        rank = producer[tokens[i]][0] if tokens[i] in producer else -1
        return (-counts.get(i, 0), rank, i)

    def place(root: int) -> None:
        # Iterative post-order walk: merge chains can be longer than the recursion limit.
        stack = [(root, False)]
        while stack:
            i, parents_done = stack.pop()
            if i in placed:
                continue
            if parents_done:
                placed.add(i)
                order.append(i)
                continue
            stack.append((i, True))
            if tokens[i] in producer:
                _, a, b = producer[tokens[i]]
                stack += [(vocab[b], False), (vocab[a], False)]

    spaces = whitespace_ids(d)
    for root in sorted((i for i in spaces if i not in placed), key=key):
        place(root)
    for root in sorted((i for i in range(len(tokens)) if i not in placed), key=key):
        place(root)
    order += last
    log.debug("ranked %d tokens, %d seen in the corpus, %d whitespace, %d specials last",
              len(order), len(counts), len(spaces), len(last))
    return order


def whitespace_ids(d: dict[str, Any]) -> list[int]:
    """Ids of vocabulary tokens that spell only whitespace: spaces (or the metaspace `▁`,
    or byte-level BPE's symbols for them), tabs, newlines."""
    blank = {" ", "\t", "\n", "\r", "\u00a0", "\u3000", *_decoder_replaced(d.get("decoder"))}
    if _has_type(d.get("pre_tokenizer"), "ByteLevel"):
        blank |= {_byte_symbols()[b] for b in (9, 10, 13, 32)}
    return sorted(i for t, i in d["model"]["vocab"].items() if t and set(t) <= blank)


def reorder_tokenizer(tokenizer: Tokenizer, order: list[int]) -> tuple[Tokenizer, list[int]]:
    """New id i is old id order[i]. Returns (tokenizer, perm) with perm[new] = old id.

    Merges are strings, so they and their priority stay as they are; only ids move.
    """
    d = _load(tokenizer)
    n = len(_id_to_token(d))
    if sorted(order) != list(range(n)):
        raise TokenizerError(f"order is not a permutation of the {n} token ids")
    new_of_old = [0] * n
    for new, old in enumerate(order):
        new_of_old[old] = new
    model = d["model"]
    model["vocab"] = dict(sorted(((t, new_of_old[i]) for t, i in model["vocab"].items()),
                                 key=lambda kv: kv[1]))
    for a in d["added_tokens"]:
        a["id"] = new_of_old[a["id"]]
    d["added_tokens"].sort(key=lambda a: a["id"])
    _map_fixed_ids(d, lambda i: new_of_old[i])
    return _build(d), list(order)


def trim_tokenizer(
    tokenizer: Tokenizer, vocab_size: int, keep_all_specials: bool = True
) -> Tokenizer:
    """Keep ids [0, vocab_size) of a tokenizer already in Matryoshka order; ids do not move.

    The base is always required. Special tokens are too unless `keep_all_specials` is False
    (an order from `rank_tokens(..., keep_first=...)` puts reserved specials last); the ids
    the post-processor or padding name are required either way.
    """
    d = _load(tokenizer)
    tokens = _id_to_token(d)
    if vocab_size >= len(tokens):
        return _build(d)
    model = d["model"]
    vocab: dict[str, int] = model["vocab"]
    cut = [t for t in _base_tokens(d) if vocab[t] >= vocab_size]
    if keep_all_specials:
        cut += [a["content"] for a in d["added_tokens"]
                if a["special"] and a["id"] >= vocab_size]
    if cut:
        raise TokenizerError(
            f"vocab_size {vocab_size} cuts {len(cut)} special or base tokens (e.g. {cut[0]!r}); "
            "they must come first (see rank_tokens)"
        )
    kept = {t: i for t, i in vocab.items() if i < vocab_size}
    prefix = model.get("continuing_subword_prefix") or ""
    merges = _merges(model)
    keep = [(a, b) for a, b in merges
            if a in kept and b in kept and _merged(a, b, prefix) in kept]
    reachable = {_merged(a, b, prefix) for a, b in keep}
    orphans = [t for t in _producers(d) if t in kept and t not in reachable]
    if orphans:
        raise TokenizerError(
            f"not in Matryoshka order: {orphans[0]!r} is kept without the tokens that merge "
            "into it; reorder with rank_tokens/reorder_tokenizer first"
        )
    model["vocab"] = kept
    model["merges"] = _encode_merges(keep, model["merges"])
    d["added_tokens"] = [a for a in d["added_tokens"] if a["id"] < vocab_size]

    def check(i: int) -> int:
        if i >= vocab_size:
            raise TokenizerError(f"post-processor or padding uses id {i} >= {vocab_size}")
        return i

    _map_fixed_ids(d, check)
    log.debug("trimmed to %d ids, %d of %d merges", vocab_size, len(keep), len(merges))
    return _build(d)


# --- tokenizer JSON --------------------------------------------------------------------------


def _load(tokenizer: Tokenizer) -> dict[str, Any]:
    d: dict[str, Any] = json.loads(tokenizer.to_str())
    if d["model"].get("type") != "BPE":
        raise TokenizerError(f"only BPE tokenizers can be trimmed, not {d['model'].get('type')}")
    return d


def _build(d: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(d, ensure_ascii=False))


def _id_to_token(d: dict[str, Any]) -> list[str]:
    by_id = {i: t for t, i in d["model"]["vocab"].items()}
    for a in d["added_tokens"]:
        by_id.setdefault(a["id"], a["content"])
    if set(by_id) != set(range(len(by_id))):
        raise TokenizerError(f"token ids are not contiguous 0..{len(by_id) - 1}")
    return [by_id[i] for i in range(len(by_id))]


def _merges(model: dict[str, Any]) -> list[Merge]:
    # tokenizers writes ["a", "b"] pairs since 0.20 and "a b" strings before.
    out: list[Merge] = []
    for m in model["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        out.append((a, b))
    return out


def _encode_merges(merges: list[Merge], like: list[Any]) -> list[Any]:
    if like and isinstance(like[0], str):
        return [f"{a} {b}" for a, b in merges]
    return [[a, b] for a, b in merges]


def _merged(a: str, b: str, prefix: str) -> str:
    return a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)


def _producers(d: dict[str, Any]) -> dict[str, tuple[int, str, str]]:
    """token -> (rank, left, right) of the highest-priority merge that makes it."""
    model = d["model"]
    vocab = model["vocab"]
    prefix = model.get("continuing_subword_prefix") or ""
    out: dict[str, tuple[int, str, str]] = {}
    for rank, (a, b) in enumerate(_merges(model)):
        t = _merged(a, b, prefix)
        if t in vocab and a in vocab and b in vocab and t not in out:
            out[t] = (rank, a, b)
    return out


def _byte_symbols() -> list[str]:
    """GPT-2's bytes_to_unicode: the character standing for each byte value 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _has_type(node: Any, name: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == name or any(_has_type(v, name) for v in node.values())
    if isinstance(node, list):
        return any(_has_type(v, name) for v in node)
    return False


def _base_tokens(d: dict[str, Any]) -> list[str]:
    """Tokens that every string can be spelled in; trimming never drops them."""
    model = d["model"]
    if model.get("byte_fallback"):
        base = [f"<0x{b:02X}>" for b in range(256)]
        if model.get("unk_token"):
            base.append(model["unk_token"])
        # The decoder maps "▁" back to " " only when it is a token of its own: spelled in
        # byte tokens it would decode as a literal "▁".
        base += [t for t in _decoder_replaced(d.get("decoder")) if t in model["vocab"]]
    elif _has_type(d.get("pre_tokenizer"), "ByteLevel"):
        base = _byte_symbols()
    else:
        raise TokenizerError("tokenizer is neither byte-level nor byte-fallback BPE: "
                             "a trimmed vocabulary could not spell every string")
    missing = [t for t in base if t not in model["vocab"]]
    if missing:
        raise TokenizerError(f"{len(missing)} base tokens missing from the vocab, e.g. "
                             f"{missing[0]!r}")
    return base


def _decoder_replaced(node: Any) -> list[str]:
    """Strings that Replace/Metaspace decoders rewrite, in tree order."""
    if isinstance(node, list):
        return [t for v in node for t in _decoder_replaced(v)]
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Replace" and "String" in node.get("pattern", {}):
        return [node["pattern"]["String"]]
    if node.get("type") == "Metaspace":
        return [node.get("replacement", "▁")]
    return _decoder_replaced(node.get("decoders"))


def _map_fixed_ids(d: dict[str, Any], f: Callable[[int], int]) -> None:
    """Apply f to the ids the post-processor and padding store next to their token text."""

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        kind = node.get("type")
        if kind == "TemplateProcessing":
            for spec in node.get("special_tokens", {}).values():
                spec["ids"] = [f(i) for i in spec["ids"]]
        elif kind in ("BertProcessing", "RobertaProcessing"):
            for role in ("sep", "cls"):
                node[role] = [node[role][0], f(node[role][1])]
        elif kind == "Sequence":
            for p in node.get("processors", []):
                walk(p)

    walk(d.get("post_processor"))
    if d.get("padding"):
        d["padding"]["pad_id"] = f(d["padding"]["pad_id"])
