"""What a finished request updates: request metrics, λ and the learned output bytes/token,
and live prompt BPB. Observed once per request, never inside the per-token loop."""

from __future__ import annotations

import time

from heads.manifest import Manifest
from router.state import LiveState
from server.gateway.generation import Outcome
from server.gateway.prompt_bpb import PromptBpbConfig, record
from server.gateway.request_plan import RequestPlan
from server.ops.metrics import Metrics
from server.ops.request_context import current_request_id
from server.ops.tracing import NoTracing


def _by_head(outcomes: list[Outcome], routed: str) -> dict[str, tuple[int, int]]:
    """head -> (generated tokens, their text bytes); all on `routed` when no event named
    its head (an unladdered request, or a backend that does not say)."""
    out: dict[str, tuple[int, int]] = {}
    for o in outcomes:
        split = o.head_tokens or {routed: o.completion_tokens}
        for h, n in split.items():
            b = o.head_bytes.get(h, 0) if o.head_tokens else o.text_bytes
            t0, b0 = out.get(h, (0, 0))
            out[h] = (t0 + n, b0 + b)
    return out


class RequestAccounting:
    def __init__(self, metrics: Metrics, state: LiveState, manifest: Manifest,
                 tracing: NoTracing, prompt_bpb: PromptBpbConfig) -> None:
        self.metrics = metrics
        self.state = state
        self.manifest = manifest
        self.tracing = tracing
        self.prompt_bpb = prompt_bpb

    def finished(self, plan: RequestPlan, outcomes: list[Outcome], status: str) -> None:
        """`status`: "200", "499" (the client went away) or "error"."""
        m, head = self.metrics, plan.head
        m.requests.labels(plan.route, head, plan.decision.policy, status).inc()
        gen_tokens = sum(o.completion_tokens for o in outcomes)
        self.tracing.annotate(head=head, policy=plan.decision.policy,
                              request_id=current_request_id() or plan.request_id,
                              prompt_tokens=plan.prompt_tokens, completion_tokens=gen_tokens,
                              status=status)
        # Generated text counts on the head that sampled it: a ladder may move a request.
        by_head = _by_head(outcomes, head)
        m.tokens.labels(head, "prompt").inc(plan.prompt_tokens)
        m.bytes.labels(head, "prompt").inc(plan.prompt_bytes)
        for h, (tokens, text_bytes) in by_head.items():
            m.tokens.labels(h, "generated").inc(tokens)
            m.bytes.labels(h, "generated").inc(text_bytes)
        firsts = [o.first_token_at for o in outcomes if o.first_token_at is not None]
        if firsts:
            m.ttft.labels(head).observe(min(firsts) - plan.started_at)
        m.e2e.labels(head).observe(time.perf_counter() - plan.started_at)
        self._choices(plan, outcomes)
        # λ counts the text served; prompt and output bytes both pass through a head.
        self.state.add_served(head, plan.prompt_bytes, plan.prompt_tokens)
        for h, (tokens, text_bytes) in by_head.items():
            self.state.add_served(h, text_bytes, tokens)
            if status == "200" and tokens:  # what the head really packs for this script
                self.state.add_output(h, plan.encoded.script, text_bytes, tokens)
        if status == "200" and plan.decision.ladder:  # where its ladder took it
            self.state.ladders.add(head, plan.encoded.script, plan.predicted_penalty(head),
                                   {h: b for h, (_, b) in by_head.items()})
        self._prompt_bpb(plan, outcomes)

    def _choices(self, plan: RequestPlan, outcomes: list[Outcome]) -> None:
        itl = self.metrics.itl.labels(plan.head)
        for o in outcomes:
            for head, loss in (o.prompt_losses or {}).items():
                self.metrics.measured_loss.labels(head).observe(max(0.0, loss))
            for move in o.moves:
                self.metrics.head_moves.labels(move.from_head, move.to_head, move.source).inc()
            for gap in o.itl:
                itl.observe(gap)
        submitted = [o.submitted_at for o in outcomes if o.submitted_at is not None]
        if submitted:
            self.metrics.queue_wait.labels(plan.head).observe(
                max(0.0, min(submitted) - plan.started_at))

    def _prompt_bpb(self, plan: RequestPlan, outcomes: list[Outcome]) -> None:
        n = plan.choices_per_prompt
        for job, o in zip(plan.jobs, outcomes, strict=True):
            if o.prompt_score is not None:
                text_bytes = len(plan.encoded.texts[job.index // n].encode())
                record(self.metrics.quality, self.state, self.manifest, self.prompt_bpb,
                       plan.head, o.prompt_score, text_bytes)
