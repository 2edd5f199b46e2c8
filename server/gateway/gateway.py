"""The gateway's request lifecycle, in three steps the routes call in order:

1. `plan_*`: validate, render and tokenize the prompt, route it to a head (RequestPlan);
2. `admit`: charge the client's rate limits, then reserve the request's KV blocks (now, on
   another head when the policy allows spill, or after a bounded wait; else 429);
3. the RequestRun that `admit` returns streams the deltas; its one `finally` releases the
   KV reservation, settles the client's charge and accounts the request, on every path.

Built once in the app's lifespan, with all of its collaborators, and injected into routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from heads.manifest import Manifest
from heads.vocab.tokenizer import HeadTokenizer
from router.admission import Ticket
from router.router import Router
from router.state import LiveState
from router.step_time_fit import FittedStepTimer
from server.backends.base import Backend
from server.gateway.accounting import RequestAccounting
from server.gateway.admission_gate import AdmissionGate
from server.gateway.generation import Delta, Outcome, generate_text
from server.gateway.request_plan import ChoiceJob, RequestPlan
from server.gateway.request_planner import RequestPlanner
from server.ops.client_guard import Charge, ClientGuard
from server.ops.metrics import Metrics
from server.ops.request_context import bind_request_id
from server.ops.tracing import NoTracing
from server.schemas import ChatCompletionRequest, CompletionRequest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestRun:
    """An admitted request. Its generator holds the client's charge and the KV ticket until
    it ends; iterate the run for the deltas, and `close` (or the end of iteration) gives both
    back."""

    plan: RequestPlan
    outcomes: list[Outcome]
    _deltas: AsyncGenerator[Delta | None, None] | None = field(default=None, repr=False)

    async def __aiter__(self) -> AsyncIterator[Delta]:
        assert self._deltas is not None
        try:
            async for d in self._deltas:
                if d is not None:
                    yield d
        finally:
            await self.close()

    async def close(self) -> None:
        """Abort what still runs and release everything; idempotent."""
        if self._deltas is not None:
            await self._deltas.aclose()


class Gateway:
    def __init__(self, manifest: Manifest, tokenizers: dict[str, HeadTokenizer],
                 backend: Backend, router: Router, state: LiveState, metrics: Metrics,
                 planner: RequestPlanner, guard: ClientGuard, admission: AdmissionGate | None,
                 accounting: RequestAccounting, tracing: NoTracing) -> None:
        self.manifest = manifest
        self.tokenizers = tokenizers
        self.backend = backend
        self.router = router
        self.state = state
        self.metrics = metrics
        self.planner = planner
        self.guard = guard
        self.admission = admission
        self.accounting = accounting
        self.tracing = tracing

    # --- 1. plan ------------------------------------------------------------------------------

    async def plan_completion(self, body: CompletionRequest,
                              session: str | None) -> RequestPlan:
        self.refresh_load()
        return await self.planner.completion(body, session)

    async def plan_chat(self, body: ChatCompletionRequest, session: str | None,
                        route: str = "/v1/chat/completions") -> RequestPlan:
        self.refresh_load()
        return await self.planner.chat(body, session, route)

    def refresh_load(self) -> None:
        """The engine's live batch per head for the router, and its step times for the fit."""
        loads = {h: (load.running, load.waiting) for h, load in self.backend.head_load().items()}
        self.state.set_loads(loads)
        timer = self.router.timer
        if isinstance(timer, FittedStepTimer):
            for t in self.backend.step_timings():  # empty unless the engine times its steps
                timer.record_step(t)

    # --- 2. admit -----------------------------------------------------------------------------

    async def admit(self, plan: RequestPlan, client: str) -> RequestRun:
        """Client limits, then KV admission; either may raise 429. The returned run is
        already started, so its `finally` runs even if nobody iterates it."""
        bind_request_id(plan.request_id)  # the log correlation id, unless the client sent one
        charge = await self.guard.charge(client, plan.prompt_tokens,
                                         sum(j.request.max_tokens for j in plan.jobs))
        try:
            plan, ticket = await self._reserve(plan)
        except BaseException:
            await self.guard.settle(charge, 0)  # nothing ran: give the output budget back
            raise
        run = RequestRun(plan, [Outcome() for _ in plan.jobs])
        # The generator holds the parts, not the run: no reference cycle, so a run dropped
        # unread is finalized at once rather than at the next garbage collection.
        run._deltas = self._run(plan, run.outcomes, charge, ticket)
        # Start it: from its first yield on, the generator's finally is guaranteed (closed by
        # the consumer, or by the event loop's async-generator finalizer if dropped unread,
        # e.g. when a streaming client disconnects before the first chunk).
        await run._deltas.__anext__()
        return run

    async def _reserve(self, plan: RequestPlan) -> tuple[RequestPlan, Ticket | None]:
        gate = self.admission
        if gate is None:
            return plan, None
        need = self._footprint(plan, plan.head)
        ticket = gate.try_now(plan.head, need, self._used_blocks())
        if ticket is None and self.router.spill_allowed and plan.decision.policy != "request_pin":
            plan, ticket = self._spill(plan, gate)
        if ticket is None:
            ticket = await gate.wait(plan.head, need, self._used_blocks)
        return plan, ticket

    def _footprint(self, plan: RequestPlan, head: str) -> int:
        """KV blocks the plan's choices are expected to hold on `head`, counted in that
        head's tokens of the prompt and its predicted output bytes/token."""
        assert self.admission is not None
        a, bpt = self.admission.admission, plan.predicted_bpt(head)
        return sum(a.footprint_blocks(head, n, plan.max_tokens, plan.choices_per_prompt, bpt)
                   for n in plan.encoded.heads[head].lengths)

    def _used_blocks(self) -> int:
        return self.backend.kv_blocks()[0]

    def _spill(self, plan: RequestPlan, gate: AdmissionGate) -> tuple[RequestPlan, Ticket | None]:
        costs = plan.decision.costs
        excluded = plan.decision.request.get("excluded", {})
        others = sorted((h for h in self.router.routable() if h != plan.head
                         and h not in excluded), key=lambda h: costs.get(h, float("inf")))
        for head in others:
            moved = self.planner.on_head(plan, head)
            ticket = gate.try_now(head, self._footprint(moved, head), self._used_blocks())
            if ticket is not None:
                decision = self.router.spill(plan.decision, head,
                                             f"{plan.head} is at its KV limit")
                self.metrics.decisions.labels(head, decision.policy, decision.code).inc()
                return dataclasses.replace(moved, decision=decision), ticket
        return plan, None

    # --- 3. run -------------------------------------------------------------------------------

    async def _run(self, plan: RequestPlan, outcomes: list[Outcome], charge: Charge,
                   ticket: Ticket | None) -> AsyncGenerator[Delta | None, None]:
        """The choices' deltas, in arrival order; the first yield (None) only marks the
        generator started."""
        status = "error"
        span = None
        try:
            yield None
            span = self.tracing.start("generate")  # not current: it spans the yields
            # One choice has nothing to merge: no pump task or queue in between.
            deltas = (self._generate(plan, plan.jobs[0], outcomes[0]) if len(plan.jobs) == 1
                      else self._merged(plan, outcomes))
            # Closing `deltas` (here, or when this generator is closed) aborts the choices
            # still running in the engine, which frees their KV blocks.
            async with contextlib.aclosing(deltas):
                async for d in deltas:
                    yield d
            status = "200"
        except (asyncio.CancelledError, GeneratorExit):
            status = "499"  # client closed the request (nginx's convention)
            raise
        finally:
            if span is not None:
                span.end()
            await self._finish(plan, outcomes, charge, ticket, status)

    async def _merged(self, plan: RequestPlan,
                      outcomes: list[Outcome]) -> AsyncGenerator[Delta, None]:
        """Several choices at once: one pump task each, merged through a queue."""
        queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(plan, j, o, queue))
                 for j, o in zip(plan.jobs, outcomes, strict=True)]
        try:
            done = 0
            while done < len(tasks):
                item = await queue.get()
                if item is None:
                    done += 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:  # aborts each choice in the engine, which frees its blocks
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _generate(self, plan: RequestPlan, job: ChoiceJob,
                  outcome: Outcome) -> AsyncGenerator[Delta, None]:
        return generate_text(self.backend, self.tokenizers[plan.head], job.request,
                             list(job.stops), job.index, outcome, job.extensions,
                             job.turn_stops)

    async def _pump(self, plan: RequestPlan, job: ChoiceJob, outcome: Outcome,
                    queue: asyncio.Queue[Delta | BaseException | None]) -> None:
        try:
            async for d in self._generate(plan, job, outcome):
                queue.put_nowait(d)
            queue.put_nowait(None)
        except Exception as e:  # delivered to the consumer, which re-raises it
            queue.put_nowait(e)

    async def _finish(self, plan: RequestPlan, outcomes: list[Outcome], charge: Charge,
                      ticket: Ticket | None, status: str) -> None:
        if ticket is not None and self.admission is not None:
            self.admission.release(ticket)
            if status == "200":  # aborted requests would bias the learned output ratio low
                ratio = self.admission.admission.ratio
                for job, o in zip(plan.jobs, outcomes, strict=True):
                    # Bytes per max_token: what the output used of its cap, in text.
                    bpt = (o.text_bytes / o.completion_tokens if o.completion_tokens
                           else plan.predicted_bpt(plan.head) or 1.0)
                    ratio.observe(o.completion_tokens, job.request.max_tokens, bpt)
        self.accounting.finished(plan, outcomes, status)
        await self.guard.settle(charge, sum(o.completion_tokens for o in outcomes))
