"""Analytic cost model: device-seconds per byte of text, for inference and for training.

Per decode step of head groups g = (head, b_g requests, ctx_g mean context tokens), with
s = weight bytes per parameter and B = Σ b_g (the backbone runs once for all groups):

    resource          bytes / FLOPs                                time
    backbone weights  N·s                                          ÷ BW
    KV read           Σ b_g·ctx_g·kv                               ÷ BW
    unembedding       Σ over passes of V_p·d·s                     ÷ BW
                      (a nested pass over heads that share rows reads the largest one's
                      V_max·d·s once, as the engine runs it when `kernels.nested_plan`
                      picks it; any other group is a pass of its own)
    group rows        Σ b_g·R_g·d·s                                ÷ BW
                      (a two-level reading's second level: R_g native rows of the sampled
                      piece's group per sequence; 0 for any other head)
    sampler traffic   Σ 8·b_g·V_g when its pass runs split         ÷ BW
                      (GEMM + sampler writes and re-reads fp32 logits; the streaming kernel
                      the engine picks below the crossover b* never materializes them; b* is
                      `kernels.crossover`'s, the rule the engine's selector uses)
    FLOPs             2·B·N + Σ 2·b_g·(V_g + R_g)·d + 2·Σ b_g·ctx_g·kv/s   ÷ F
                      (backbone, unembedding, attention QKᵀ and AV over the KV elements)

The memory resources share one bus, so the optimistic floor maxes their *sum* against
compute (a max over the separate reads would not be a floor any device reaches); the
pessimistic floor sums everything (no overlap at all). Both add the per-step launch overhead.
Uncalibrated, the estimate is their midpoint; `router.step_time_fit` fits measured steps.

    C_infer(V, B)     = step_time ÷ (B · bytes_per_token)         device-s per served byte
    C_train(V)        = 6·(N + V·d) ÷ F ÷ bytes_per_token         device-s per training byte
    C_lifecycle(V)    = C_train(V) + λ·C_infer(V, B)              device-s per training byte

One request's marginal cost on head h, given the live mix of head groups G that it joins:

    Δ_h        = T(G with h's group one larger) − T(G)            s per decode step
    C_req(h)   = (prefill_h + n_h · Δ_h) ÷ (n_h · bpt_out_h)      device-s per output byte

A request that opens a group adds that head's whole V·d read to every step; one that joins
a running group shares it; one on a head nested inside a larger live head's rows adds its
FLOPs (and sampler work) only, so a smaller head is nearly free while a larger one is live.
n_h is max_tokens (the cap the request may use) and bpt_out_h its predicted output
bytes/token on h (router.compression).

C_train counts 6 FLOP per parameter per training token (forward 2 + backward 4) at the
device's peak: a floor; a real run at 40–50% MFU costs about twice that, for every V alike.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kernels.crossover import DEFAULT_MODE, dtype_for_bytes, picks_split
from kernels.crossover_calibration import CrossoverCalibration
from kernels.devices import DeviceSpec
from kernels.nested_plan import GroupShape, effective_batch, plan_nested
from router.profiles import HeadProfile, RequestFeatures

log = logging.getLogger(__name__)

LOGIT_BYTES = 8.0  # fp32 logits written by the GEMM and read back by the sampler, per element


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds per decode step, by resource."""

    weights_s: float
    kv_s: float
    unembed_s: float
    compute_s: float
    overhead_s: float
    sampler_s: float = 0.0

    @property
    def memory_s(self) -> float:
        return self.weights_s + self.kv_s + self.unembed_s + self.sampler_s

    @property
    def optimistic_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s

    @property
    def pessimistic_s(self) -> float:
        return self.memory_s + self.compute_s + self.overhead_s

    @property
    def estimate_s(self) -> float:
        return 0.5 * (self.optimistic_s + self.pessimistic_s)

    def resources(self) -> dict[str, float]:
        return {"weights": self.weights_s, "kv": self.kv_s, "unembed": self.unembed_s,
                "sampler": self.sampler_s, "compute": self.compute_s}


@dataclass(frozen=True, slots=True)
class LifecycleCost:
    train: float  # device-s per training byte
    infer: float  # device-s per served byte
    lam: float  # served bytes ÷ training bytes

    @property
    def total(self) -> float:
        return self.train + self.lam * self.infer


@dataclass(frozen=True, slots=True)
class Group:
    """One head group inside an engine step."""

    head: HeadProfile
    batch: int
    ctx_tokens: float  # mean KV context per request, tokens


def prompt_tokens(head: HeadProfile, features: RequestFeatures) -> float:
    """The prompt in this head's tokens: counted when the gateway tokenized it, else
    estimated from the manifest's bytes/token."""
    t = features.tokens.get(head.name)
    return float(t.prompt_tokens) if t is not None else features.prompt_bytes / head.bpt


def context_tokens(head: HeadProfile, features: RequestFeatures) -> float:
    """Mean KV context of the request during decode, in this head's tokens.

    The prompt shrinks with the head's compression; max_tokens is already in its tokens, and
    on average half of it has been generated.
    """
    return prompt_tokens(head, features) + features.max_tokens / 2


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """Analytic seconds of one prompt's prefill, by resource, at the device's peaks."""

    memory_s: float  # the head's unembedding read, for the last position's logits
    compute_s: float  # 2·N FLOP per prompt token computed
    measure_s: float  # the prompt measurement: one native read + its product's FLOPs

    @property
    def analytic_s(self) -> float:
        return self.memory_s + self.compute_s + self.measure_s


def prefill_cost(head: HeadProfile, device: DeviceSpec, tokens: float,
                 measured: float) -> PrefillCost:
    """tokens: prompt tokens computed; measured: prompt positions the engine's measured
    quality control scores (a [measured, d] × [measure_rows, d] product)."""
    s = head.weight_bytes_per_param
    native = head.measure_rows * head.hidden_size
    measure = 0.0
    if native and measured > 0:
        measure = native * s / device.mem_bw + 2.0 * measured * native / device.peak_flops
    return PrefillCost(head.unembed_params * s / device.mem_bw,
                       2.0 * head.backbone_params * tokens / device.peak_flops, measure)


def measured_positions(head: HeadProfile, tokens: float) -> int:
    """Prompt positions the engine's measurement scores on a `tokens`-token prompt: up to
    head.measure_positions from the later half of its predicted positions, none below
    MIN_MEASURED_POSITIONS (heads.engine.quality_control); 0 for an unmeasured head."""
    predicted = max(0, math.ceil(tokens) - 1)
    if not head.measure_rows or predicted < MIN_MEASURED_POSITIONS:
        return 0
    return min(head.measure_positions, predicted - predicted // 2)


def prefill_s(head: HeadProfile, timer: StepTimer, tokens: float, measure: bool = True
              ) -> float:
    """A prompt's prefill on `head`, its measurement included where the head is measured
    and `measure` holds: as the timer measured such prefills when it did
    (router.prefill_time_fit), else the analytic PrefillCost at peak."""
    return timer.prefill_time(head, tokens, measured_positions(head, tokens) if measure else 0)


# Predicted prompt positions below which the engine does not measure a prompt
# (QualityLadder.min_positions).
MIN_MEASURED_POSITIONS = 8


def group_rows(head: HeadProfile) -> float:
    """Parameters a two-level reading's second level reads per sequence and step (its
    sampled piece's group of native rows); 0 for any other head."""
    return head.group_rows * head.hidden_size


def split_kernel(group: Group, device: DeviceSpec,
                 calibration: CrossoverCalibration | None = None) -> bool:
    """Whether the engine runs this group as GEMM + sampler (logits materialized)."""
    h = group.head
    return picks_split(group.batch, h.vocab_size, h.hidden_size,
                       dtype_for_bytes(h.weight_bytes_per_param), DEFAULT_MODE, device,
                       calibration)


def unembed_passes(groups: Sequence[Group], device: DeviceSpec,
                   calibration: CrossoverCalibration | None = None) -> list[tuple[Group, ...]]:
    """The step's unembedding passes as the engine runs them: groups whose heads share rows
    in one nested pass when `kernels.nested_plan` says so (the engine's rule), else one pass
    per group."""
    shared: dict[tuple, list[Group]] = {}
    passes: list[tuple[Group, ...]] = []
    for g in groups:
        h = g.head
        if h.shared_rows is None:
            passes.append((g,))
        else:
            shared.setdefault((h.shared_rows, h.hidden_size, h.weight_bytes_per_param),
                              []).append(g)
    for gs in shared.values():
        passes.extend([tuple(gs)] if len(gs) > 1 and _nested(gs, device, calibration)
                      else [(g,) for g in gs])
    return passes


def _nested(groups: Sequence[Group], device: DeviceSpec,
            calibration: CrossoverCalibration | None) -> bool:
    h = groups[0].head
    return plan_nested([GroupShape(g.batch, g.head.vocab_size) for g in groups],
                       h.hidden_size, dtype_for_bytes(h.weight_bytes_per_param), DEFAULT_MODE,
                       device, calibration).nested


def _pass_bytes(p: tuple[Group, ...], device: DeviceSpec,
                calibration: CrossoverCalibration | None) -> tuple[float, float]:
    """(W bytes read, sampler bytes) of one unembedding pass. A nested pass reads the
    largest head's rows once and runs split iff its FLOP-equivalent batch on that head does."""
    if len(p) == 1:
        g = p[0]
        h = g.head
        split = split_kernel(g, device, calibration)
        return (h.unembed_params * h.weight_bytes_per_param,
                LOGIT_BYTES * g.batch * h.vocab_size if split else 0.0)
    top = max((g.head for g in p), key=lambda h: h.vocab_size)
    b_eff = effective_batch([GroupShape(g.batch, g.head.vocab_size) for g in p])
    split = split_kernel(Group(top, b_eff, 0.0), device, calibration)
    cells = sum(g.batch * g.head.vocab_size for g in p)
    return top.unembed_params * top.weight_bytes_per_param, LOGIT_BYTES * cells if split else 0.0


def mixed_step_cost(groups: Sequence[Group], device: DeviceSpec,
                    calibration: CrossoverCalibration | None = None) -> StepCost:
    if not groups:
        raise ValueError("a step needs at least one head group")
    weights = kv = unembed = sampler = flops = probe = 0.0
    for g in groups:
        if g.batch < 1:
            raise ValueError(f"batch must be >= 1, got {g.batch}")
        if g.ctx_tokens < 0:
            raise ValueError(f"ctx_tokens must be >= 0, got {g.ctx_tokens}")
        h, s = g.head, g.head.weight_bytes_per_param
        # One backbone read per step, whichever group is biggest (heads share the backbone).
        weights = max(weights, h.backbone_params * s)
        kv += g.batch * g.ctx_tokens * h.kv_bytes_per_token
        flops += 2.0 * g.batch * (h.backbone_params + h.unembed_params + group_rows(h))
        flops += 2.0 * g.batch * g.ctx_tokens * h.kv_bytes_per_token / s
        unembed += g.batch * group_rows(h) * s  # a reading's second level, per sequence
        probe = max(probe, h.probe_rows * h.hidden_size * s)  # one per step, shared
    unembed += probe
    for p in unembed_passes(groups, device, calibration):
        w_bytes, s_bytes = _pass_bytes(p, device, calibration)
        unembed += w_bytes
        sampler += s_bytes
    bw = device.mem_bw
    return StepCost(weights / bw, kv / bw, unembed / bw, flops / device.peak_flops,
                    device.launch_overhead_s, sampler / bw)


def step_cost(head: HeadProfile, device: DeviceSpec, batch: int, ctx_tokens: float) -> StepCost:
    return mixed_step_cost((Group(head, batch, ctx_tokens),), device)


class StepTimer(Protocol):
    """Seconds per decode step for a set of head groups (analytic, or calibrated)."""

    @property
    def device(self) -> DeviceSpec: ...

    def step_time(self, groups: Sequence[Group]) -> float: ...

    # The model's time, smooth across shapes (a calibrated timer's step_time returns a
    # measured shape's own noisy average): marginal costs scale its differences.
    def model_time(self, groups: Sequence[Group]) -> float: ...

    def prefill_time(self, head: HeadProfile, tokens: float, measured: int) -> float: ...


@dataclass(frozen=True, slots=True)
class AnalyticTimer:
    device: DeviceSpec
    # The engine's kernel calibration for this device, so both pick the same kernel per group.
    kernel_calibration: CrossoverCalibration | None = None

    def step_time(self, groups: Sequence[Group]) -> float:
        return mixed_step_cost(groups, self.device, self.kernel_calibration).estimate_s

    def model_time(self, groups: Sequence[Group]) -> float:
        return self.step_time(groups)

    def prefill_time(self, head: HeadProfile, tokens: float, measured: int) -> float:
        return prefill_cost(head, self.device, tokens, measured).analytic_s


def _timer(model: DeviceSpec | StepTimer) -> StepTimer:
    return AnalyticTimer(model) if isinstance(model, DeviceSpec) else model


def infer_cost_per_byte(
    head: HeadProfile, device: DeviceSpec | StepTimer, batch: int, ctx_tokens: float
) -> float:
    """C_infer: device-seconds per served byte at group size `batch`."""
    t = _timer(device).step_time((Group(head, batch, ctx_tokens),))
    return t / (batch * head.bpt)


def mix_cost_per_byte(timer: StepTimer, groups: Sequence[Group]) -> float:
    """Device-seconds per served byte of a step of these groups: its time ÷ Σ b_g·bpt_g.
    One group of B on head h is C_infer(h, B)."""
    return timer.step_time(groups) / sum(g.batch * g.head.bpt for g in groups)


def train_cost_per_byte(head: HeadProfile, device: DeviceSpec | StepTimer) -> float:
    """C_train: device-seconds per training byte (6 FLOP per parameter per token, at peak)."""
    peak = _timer(device).device.peak_flops
    return 6.0 * (head.backbone_params + head.unembed_params) / peak / head.bpt


def lifecycle_cost(
    head: HeadProfile, device: DeviceSpec | StepTimer, batch: int, lam: float,
    ctx_tokens: float,
) -> LifecycleCost:
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    return LifecycleCost(
        train=train_cost_per_byte(head, device),
        infer=infer_cost_per_byte(head, device, batch, ctx_tokens),
        lam=lam,
    )


def join(live: Sequence[Group], head: HeadProfile, ctx_tokens: float) -> tuple[Group, ...]:
    """The live mix with one more request of `ctx_tokens` context in `head`'s group."""
    out, joined = [], False
    for g in live:
        if g.head.name == head.name:
            ctx = (g.batch * g.ctx_tokens + ctx_tokens) / (g.batch + 1)
            out.append(Group(head, g.batch + 1, ctx))
            joined = True
        else:
            out.append(g)
    if not joined:
        out.append(Group(head, 1, ctx_tokens))
    return tuple(out)


def marginal_step_s(head: HeadProfile, timer: StepTimer, live: Sequence[Group],
                    ctx_tokens: float, before: float | None = None) -> float:
    """Seconds per decode step that one more request on `head` adds to the live mix.
    `before`: the live mix's own step time, when the caller prices several heads against it."""
    if before is None:
        before = live_step_s(timer, live)
    joined = join(live, head, ctx_tokens)
    if live:
        # The live mix's measured time, scaled by what the model says one more request of
        # this head adds to it. Measured shapes are each a noisy average of their own: the
        # difference of two priced a request that opens a second, larger head's group
        # beside 14 on 131k as cheaper than joining them (measured on the demo at c = 16),
        # and every step then read the larger head's rows.
        model = timer.model_time(live)
        delta = before * (timer.model_time(joined) / model - 1.0) if model > 0 else 0.0
    else:
        delta = timer.step_time(joined)
    # A calibrated timer's measured shapes are noisy; a request never costs less than its own
    # FLOPs at peak (2·(N + V·d) per token, plus attention over its context).
    d = timer.device
    floor = 2.0 * (head.backbone_params + head.unembed_params + group_rows(head)
                   + ctx_tokens * head.kv_bytes_per_token / head.weight_bytes_per_param) \
        / d.peak_flops
    return max(delta, floor)


def live_step_s(timer: StepTimer, live: Sequence[Group]) -> float:
    return timer.step_time(live) if live else 0.0


def request_cost_per_byte(head: HeadProfile, timer: StepTimer, live: Sequence[Group],
                          features: RequestFeatures, before: float | None = None) -> float:
    """C_req: device-seconds per output byte this request adds on `head` (see the header).
    `before`: live_step_s(timer, live), when already known."""
    n = max(1, features.max_tokens)
    step = marginal_step_s(head, timer, live, context_tokens(head, features), before)
    prefill = prefill_s(head, timer, prompt_tokens(head, features),
                        head.name not in features.unmeasured)
    return (prefill + n * step) / (n * features.output_bpt(head))
