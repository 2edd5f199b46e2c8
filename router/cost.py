"""Analytic cost model: device-seconds per byte of text, for inference and for training.

Per decode step of a head group of b requests (s = weight bytes per parameter):

    memory bytes  = N·s (backbone weights) + b·ctx·kv (KV read) + V·d·s (unembedding)
    FLOPs         = 2·b·(N + V·d)
    memory time   = memory bytes ÷ BW,  compute time = FLOPs ÷ F

The three reads share one memory bus, so they are summed into one memory time rather than
maxed (a max of the separate reads would undercut the roofline). Then:

    optimistic  = max(memory, compute) + overhead   (perfect overlap: the roofline)
    pessimistic = memory + compute + overhead       (no overlap)
    estimate    = (optimistic + pessimistic) / 2    (until calibration fits the blend)

Sampler traffic is left out: with a fused kernel it is folded into the unembedding read.

    C_infer(V, B)     = step_time ÷ (B · bytes_per_token)     device-s per served byte
    C_train(V)        = 6·(N + V·d) ÷ F ÷ bytes_per_token     device-s per training byte
    C_lifecycle(V)    = C_train(V) + λ·C_infer(V, B)          device-s per training byte
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from router.devices import DeviceSpec
from router.profiles import HeadProfile, RequestFeatures

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per decode step of one head group, by resource."""

    weights_s: float
    kv_s: float
    unembed_s: float
    compute_s: float
    overhead_s: float

    @property
    def memory_s(self) -> float:
        return self.weights_s + self.kv_s + self.unembed_s

    @property
    def optimistic_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s

    @property
    def pessimistic_s(self) -> float:
        return self.memory_s + self.compute_s + self.overhead_s

    @property
    def estimate_s(self) -> float:
        return 0.5 * (self.optimistic_s + self.pessimistic_s)


@dataclass(frozen=True, slots=True)
class LifecycleCost:
    train: float  # device-s per training byte
    infer: float  # device-s per served byte
    lam: float  # served bytes ÷ training bytes

    @property
    def total(self) -> float:
        return self.train + self.lam * self.infer


def context_tokens(head: HeadProfile, features: RequestFeatures) -> float:
    """Mean KV context of the request during decode, in this head's tokens.

    The prompt shrinks with the head's compression; max_tokens is already in its tokens, and
    on average half of it has been generated.
    """
    return features.prompt_bytes / head.bpt + features.max_tokens / 2


def step_cost(head: HeadProfile, device: DeviceSpec, batch: int, ctx_tokens: float) -> StepCost:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if ctx_tokens < 0:
        raise ValueError(f"ctx_tokens must be >= 0, got {ctx_tokens}")
    s = head.weight_bytes_per_param
    flops = 2.0 * batch * (head.backbone_params + head.unembed_params)
    return StepCost(
        weights_s=head.backbone_params * s / device.mem_bw,
        kv_s=batch * ctx_tokens * head.kv_bytes_per_token / device.mem_bw,
        unembed_s=head.unembed_params * s / device.mem_bw,
        compute_s=flops / device.peak_flops,
        overhead_s=device.launch_overhead_s,
    )


def infer_cost_per_byte(
    head: HeadProfile, device: DeviceSpec, batch: int, ctx_tokens: float
) -> float:
    """C_infer: device-seconds per served byte at group size `batch`."""
    return step_cost(head, device, batch, ctx_tokens).estimate_s / (batch * head.bpt)


def train_cost_per_byte(head: HeadProfile, device: DeviceSpec) -> float:
    """C_train: device-seconds per training byte (6 FLOP per parameter per token, at peak)."""
    return 6.0 * (head.backbone_params + head.unembed_params) / device.peak_flops / head.bpt


def lifecycle_cost(
    head: HeadProfile, device: DeviceSpec, batch: int, lam: float, ctx_tokens: float
) -> LifecycleCost:
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    return LifecycleCost(
        train=train_cost_per_byte(head, device),
        infer=infer_cost_per_byte(head, device, batch, ctx_tokens),
        lam=lam,
    )
