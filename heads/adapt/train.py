"""Fit one head's adapter on cached hidden states (heads/adapt/cache.py); backbone frozen.

Loss per batch of positions, logits z [n, V] of the adapted head:
    CE(z, next head token)                         the head's own segmentation
  + kl_weight · KL(q ‖ softmax z)                  q: the native distribution folded onto
                                                   the head's tokens (top k), where it applies
  + l2 · Σ θ²                                      over the adapter's parameters

Early stopping on held-out BPB (bits over UTF-8 bytes of the held-out windows); the best
parameters seen are the result. State is saved at every evaluation, so a rerun with the
same configuration continues where the last one stopped.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from heads.manifest import BIAS, HIDDEN_DOWN, HIDDEN_UP, LOWRANK_A, LOWRANK_B

log = logging.getLogger(__name__)

KL_WHERE = ("boundary", "all")
EVAL_ROWS = 1024  # held-out logits per chunk: [1024, V] fp32


@dataclass(frozen=True, slots=True)
class TrainConfig:
    kind: str = "hidden"  # heads.manifest.ADAPTER_KINDS; hidden measured better on the demo
    rank: int = 32
    steps: int = 300  # the most optimizer steps; early stopping may end sooner
    batch: int = 512  # positions per step
    lr: float = 3e-3
    kl_weight: float = 1.0
    kl_where: str = "all"  # KL_WHERE: every position, or only native token boundaries
    l2: float = 1e-5
    eval_every: int = 50
    patience: int = 3  # evaluations without a new best before stopping
    seed: int = 0


class AdapterParams(nn.Module):
    """The trainable tensors of one head; zero-initialized corrections, so step 0 is the
    unadapted head exactly (the random factor B / D only gives the zero factor a gradient)."""

    def __init__(self, kind: str, rank: int, vocab: int, d: int, seed: int) -> None:
        super().__init__()
        self.kind = kind
        gen = torch.Generator().manual_seed(seed)
        rand = torch.randn(rank, d, generator=gen) / math.sqrt(d)
        self.bias = nn.Parameter(torch.zeros(vocab))
        if kind == "lowrank":
            self.a = nn.Parameter(torch.zeros(vocab, rank))
            self.b = nn.Parameter(rand)
        else:
            self.down = nn.Parameter(rand)
            self.up = nn.Parameter(torch.zeros(d, rank))

    def logits(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # h: [n, d], w: [V, d] frozen rows -> [n, V]; the same math as heads/model/adapter.py
        if self.kind == "lowrank":
            return h @ w.T + (h @ self.b.T) @ self.a.T + self.bias
        return (h + (h @ self.down.T) @ self.up.T) @ w.T + self.bias

    def l2(self) -> torch.Tensor:
        return sum((p * p).sum() for p in self.parameters())  # type: ignore[return-value]

    def stored(self, prefix: str) -> dict[str, torch.Tensor]:
        """Checkpoint tensor name -> fp32 tensor (heads/manifest.py names)."""
        roles = ({BIAS: self.bias, LOWRANK_A: self.a, LOWRANK_B: self.b}
                 if self.kind == "lowrank"
                 else {BIAS: self.bias, HIDDEN_DOWN: self.down, HIDDEN_UP: self.up})
        return {prefix + k: v.detach().float().clone().contiguous() for k, v in roles.items()}


def batch_loss(params: AdapterParams, w: torch.Tensor, data: dict[str, torch.Tensor],
               idx: torch.Tensor, cfg: TrainConfig) -> torch.Tensor:
    z = params.logits(data["hidden"][idx], w)  # [n, V]
    logp = F.log_softmax(z, dim=-1)
    ce = F.nll_loss(logp, data["target"][idx])
    q = data["teacher_probs"][idx]  # [n, k]
    kl_rows = (q * (q.clamp_min(1e-12).log() - logp.gather(1, data["teacher_ids"][idx]))
               ).sum(-1)  # [n]
    if cfg.kl_where == "boundary":
        mask = data["boundary"][idx].float()
        kl = (kl_rows * mask).sum() / mask.sum().clamp_min(1.0)
    else:
        kl = kl_rows.mean()
    return ce + cfg.kl_weight * kl + cfg.l2 * params.l2()


@torch.no_grad()
def heldout_bits(params: AdapterParams | None, w: torch.Tensor,
                 data: dict[str, torch.Tensor]) -> torch.Tensor:
    """Bits per source [S] fp64 over the held-out positions; None: the unadapted head."""
    n_sources = data["bytes"].numel()
    bits = torch.zeros(n_sources, dtype=torch.float64)
    for r in range(0, data["target"].numel(), EVAL_ROWS):
        h = data["hidden"][r:r + EVAL_ROWS]
        z = h @ w.T if params is None else params.logits(h, w)
        nats = F.cross_entropy(z, data["target"][r:r + EVAL_ROWS], reduction="none")
        bits.index_add_(0, data["source"][r:r + EVAL_ROWS], nats.double() / math.log(2))
    return bits


def bpb(bits: torch.Tensor, data: dict[str, torch.Tensor]) -> float:
    return float(bits.sum()) / float(data["bytes"].sum())


@dataclass(frozen=True, slots=True)
class TrainResult:
    params: AdapterParams  # the best parameters seen
    steps: int  # optimizer steps taken (over all runs of a resumed training)
    best_step: int  # the step `params` come from
    heldout_bpb_before: float
    heldout_bpb_after: float  # of `params`
    history: tuple[tuple[int, float], ...]  # (step, held-out BPB) at every evaluation


def train(w: torch.Tensor, train_data: dict[str, torch.Tensor],
          heldout: dict[str, torch.Tensor], cfg: TrainConfig, state_path: Path) -> TrainResult:
    """`w`: the head's frozen rows [V, d] fp32. Resumes from `state_path` when it holds a
    run of the same configuration."""
    vocab, d = w.shape
    params = AdapterParams(cfg.kind, cfg.rank, vocab, d, cfg.seed)
    opt = torch.optim.Adam(params.parameters(), lr=cfg.lr)
    before = bpb(heldout_bits(None, w, heldout), heldout)
    step, best, bad, history = 0, before, 0, [(0, before)]
    best_step = 0
    best_state = {k: v.clone() for k, v in params.state_dict().items()}
    if state_path.is_file():
        saved = torch.load(state_path, weights_only=False)
        if saved["config"] == asdict(cfg):
            params.load_state_dict(saved["params"])
            opt.load_state_dict(saved["optimizer"])
            step, best, bad = saved["step"], saved["best"], saved["bad"]
            best_step = saved["best_step"]
            best_state, history = saved["best_params"], saved["history"]
            log.info("resuming at step %d (best held-out BPB %.4f)", step, best)
    n = train_data["target"].numel()
    per_epoch = max(1, n // cfg.batch)
    bar = tqdm(total=cfg.steps, initial=step, desc="adapt", unit="step", mininterval=2.0)
    while step < cfg.steps and bad < cfg.patience:
        epoch, i = divmod(step, per_epoch)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed + epoch))
        idx = order[i * cfg.batch:(i + 1) * cfg.batch]
        loss = batch_loss(params, w, train_data, idx, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            now = bpb(heldout_bits(params, w, heldout), heldout)
            history.append((step, now))
            if now < best:
                best, bad, best_step = now, 0, step
                best_state = {k: v.detach().clone() for k, v in params.state_dict().items()}
            else:
                bad += 1
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", heldout_bpb=f"{now:.4f}",
                            best=f"{best:.4f}")
            _save(state_path, cfg, params, opt, step,
                  {"best": best, "bad": bad, "best_step": best_step, "best_params": best_state,
                   "history": history})
    bar.close()
    params.load_state_dict(best_state)
    return TrainResult(params, step, best_step, before, best, tuple(history))


def _save(path: Path, cfg: TrainConfig, params: AdapterParams, opt: torch.optim.Optimizer,
          step: int, progress: dict[str, Any]) -> None:
    """`progress`: best, bad (evaluations without a new best), best_step, best_params,
    history."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"config": asdict(cfg), "params": params.state_dict(),
                "optimizer": opt.state_dict(), "step": step, **progress}, tmp)
    tmp.replace(path)
