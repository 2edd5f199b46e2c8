"""Everything an adaptation needs from the frozen model, computed once and cached on disk.

Per position (a head token predicted by the hidden state before it):
- `hidden` [N, d] fp32: the backbone's final-normed state on the head's own BOS-prefixed
  window (the backbone is frozen, so it never changes during training);
- `target` [N] int64: the head token that follows;
- `teacher_ids`/`teacher_probs` [N, k]: the native head's distribution at that same hidden
  state, folded onto the head's tokens (see `fold_map`) and kept as its top k, renormalized;
- `boundary` [N] bool: the target starts where a native token starts (char offsets), i.e.
  the native head could have emitted that spelling's first piece there;
- `source` [N] int64: index into the split's source list; `bytes` [S]: UTF-8 bytes per source.

A two-level reading's positions (build_split's `reading`) are the native tokenization's:
the hidden state over native ids, the target the piece whose group holds the next native id,
the teacher the native distribution summed per group.

A 262k-row native logit costs ~335 MFLOP a position, more than the backbone itself, hence
one pass here rather than one per training step.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tqdm import tqdm

from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint
from heads.vocab.piece_groups import PieceGroups
from heads.vocab.specials import spelled_specials
from heads.vocab.tokenizer import HeadTokenizer

log = logging.getLogger(__name__)

TEACHER_ROWS = 256  # native logits per chunk: [256, 262k] fp32 = 268 MB


def fold_map(native: Tokenizer, head: HeadTokenizer, v_head: int, v_native: int
             ) -> torch.Tensor:
    """[V_native] int64: where each native token's probability goes on the head. A token the
    head kept maps to itself; a removed one (id >= V_head) to the first head token of its
    spelling, or -1 (mass dropped) when it spells nothing (special tokens)."""
    removed = list(range(v_head, v_native))
    texts = native.decode_batch([[t] for t in removed], skip_special_tokens=True)
    firsts = [ids[0] if ids else -1 for ids in head.encode_batch(texts)]
    return torch.cat([torch.arange(v_head), torch.tensor(firsts, dtype=torch.int64)])


def segment(head: HeadTokenizer, head_plain: Tokenizer, native_plain: Tokenizer, text: str
            ) -> tuple[list[int], list[bool]]:
    """The head's ids of `text` (what `head.encode` returns) and, per id, whether it starts
    where a native token starts. A boundary-preserving head re-spells native tokens, so
    its first piece of each is the boundary; any other head is matched by char offsets."""
    native = native_plain.encode(text, add_special_tokens=False)
    if head.split is not None:
        src = head.split.sources(native.ids).tolist()
        return head.split.expand(native.ids), [i == 0 or src[i] != src[i - 1]
                                                for i in range(len(src))]
    enc = head_plain.encode(text, add_special_tokens=False)
    starts = {a for a, _ in native.offsets}
    return enc.ids, [a in starts for a, _ in enc.offsets]


def folded_top_k(logits: torch.Tensor, fold: torch.Tensor, v_head: int, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    # logits: [n, V_native] fp32 -> (ids [n, k] int64, probs [n, k] fp32 summing to 1)
    p = torch.softmax(logits, dim=-1)
    q = p[:, :v_head].clone()
    keep = fold[v_head:] >= 0
    q.index_add_(1, fold[v_head:][keep], p[:, v_head:][:, keep])
    probs, ids = q.topk(min(k, v_head), dim=-1)
    return ids, probs / probs.sum(-1, keepdim=True)


def build_split(ckpt: Checkpoint, head: str, windows: dict[str, list[str]], top_k: int,
                desc: str, reading: bool = False) -> dict[str, torch.Tensor]:
    """`reading`: the positions of `head`'s two-level reading instead. The backbone reads the
    native ids, each position's target is the piece whose group holds the next native id,
    and the teacher is the native distribution summed per group: the first level's loss is
    then exactly the reading's loss against the native head (its second level is exact)."""
    spec = ckpt.manifest.head(head)
    native = ckpt.manifest.native
    head_tok = ckpt.tokenizers[head]
    tok_h = spelled_specials(head_tok.tokenizer)
    tok_n = spelled_specials(ckpt.tokenizers[native.name].tokenizer)
    if reading:
        if head_tok.split is None:
            raise ValueError(f"head {head!r} has no split table, so no two-level reading")
        piece_of = torch.from_numpy(PieceGroups.from_split(head_tok.split).piece)
        fold, reader, bos = piece_of, native.name, native.bos_token_id
    else:
        fold = fold_map(tok_n, head_tok, spec.vocab_size, native.vocab_size)
        reader, bos = head, spec.bos_token_id
    w_native = ckpt.model.head_output(native.name).weight.float()  # [V_native, d]
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in
                                           ("hidden", "target", "teacher_ids",
                                            "teacher_probs", "boundary", "source")}
    n_bytes = []
    pieces = [(s, p) for s, ps in windows.items() for p in ps]
    sources = list(windows)
    for source, piece in tqdm(pieces, desc=desc, unit="window", mininterval=2.0):
        if reading:
            read = tok_n.encode(piece, add_special_tokens=False).ids
            targets, boundary = piece_of[read].tolist(), [True] * len(read)
        else:
            read, boundary = segment(head_tok, tok_h, tok_n, piece)
            targets = read
        if not read:
            continue
        ctx = ([bos] if bos is not None else []) + read
        hidden = forward_hidden(ckpt, reader, ctx)[:-1].float()  # row i predicts ctx[i + 1]
        first = 0 if bos is not None else 1  # no BOS: token 0 is unpredicted
        cols["hidden"].append(hidden)
        cols["target"].append(torch.tensor(targets[first:]))
        cols["boundary"].append(torch.tensor(boundary[first:]))
        cols["source"].append(torch.full((hidden.shape[0],), sources.index(source)))
        with torch.inference_mode():
            for r in range(0, hidden.shape[0], TEACHER_ROWS):
                top, probs = folded_top_k(hidden[r:r + TEACHER_ROWS] @ w_native.T, fold,
                                          spec.vocab_size, top_k)
                cols["teacher_ids"].append(top)
                cols["teacher_probs"].append(probs)
    for s in sources:
        n_bytes.append(sum(len(p.encode()) for p in windows[s]))
    out = {k: torch.cat(v) for k, v in cols.items()}
    out["bytes"] = torch.tensor(n_bytes, dtype=torch.int64)
    return out


def load_or_build(path: Path, ckpt: Checkpoint, head: str, windows: dict[str, list[str]],
                  top_k: int, desc: str, reading: bool = False
                  ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The split's tensors and its source names, from `path` when it is there."""
    if path.is_file():
        tensors = load_file(str(path))
        meta = json.loads(path.with_suffix(".json").read_text())
        log.info("%s: %d positions from the cache %s", desc, tensors["target"].numel(), path)
        return tensors, meta["sources"]
    tensors = build_split(ckpt, head, windows, top_k, desc, reading)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    path.with_suffix(".json").write_text(json.dumps({"sources": list(windows)}))
    tmp.replace(path)
    return tensors, list(windows)
