"""LocalEngine: the asyncio face of the engine; one background thread runs the step loop.

Threading: the asyncio side only touches `_inbox`, `_aborts` and `_streams`, under `_cond`.
The step thread owns the scheduler and takes `_cond` for bookkeeping only, never while the
model runs (torch releases the GIL there, so the event loop keeps serving). Events reach each
request's asyncio.Queue through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Collection

from heads.engine.block_manager import BlockManager
from heads.engine.config import EngineConfig
from heads.engine.grammar import GrammarCompiler
from heads.engine.grouped_reading import GroupedReading
from heads.engine.model_runner import ModelRunner
from heads.engine.scheduler import Scheduler
from heads.engine.sequence import DraftState, LadderState, Sequence
from heads.engine.types import DraftTally, GenerationRequest, HeadLoad, StepTiming, TokenEvent
from heads.errors import EngineError, EngineStopped, EngineUnsupported
from heads.model.multi_head import MultiHeadModel

log = logging.getLogger(__name__)


STEP_LOG = 4096  # recent step timings kept for the gateway to read

_Stream = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[TokenEvent | EngineError]"]


class LocalEngine:
    def __init__(self, model: MultiHeadModel, config: EngineConfig,
                 grammars: GrammarCompiler | None = None,
                 readings: Collection[GroupedReading] = ()) -> None:
        """`readings`: two-level readings of split heads, each served as a head of its own
        (heads/engine/grouped_reading.py); registered on `model` here."""
        self.model = model
        self.readings = {r.name: r for r in readings}
        for r in readings:
            model.add_reading(r.name, r.head)
        self.config = config
        self.grammars = grammars  # structured output; None: such requests are refused
        backbone = model.manifest.backbone
        self.max_model_len = config.model_len(backbone)
        num_blocks = config.num_blocks(backbone, model.dtype_name)
        self.layout = config.layout(backbone)
        native = model.manifest.native.name
        self._blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                    self.layout, dict.fromkeys(self.readings, native))
        self._scheduler = Scheduler(
            self._blocks, config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len
        )
        self._runner = ModelRunner(model, config, num_blocks, self.readings)
        self._cond = threading.Condition()
        self._inbox: list[Sequence] = []  # added, not yet handed to the scheduler
        self._aborts: list[Sequence] = []
        self._streams: dict[int, _Stream] = {}  # seq_id -> its consumer
        self._accepting = True
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._timings: deque[StepTiming] = deque(maxlen=STEP_LOG)

    async def start(self) -> None:
        if self._thread is not None:
            return
        if not self._accepting:
            raise EngineStopped("engine was shut down")
        self._runner.release_openmp_workers()  # this (loading) thread's, before the step thread's
        self._thread = threading.Thread(target=self._loop, name="polyhead-engine", daemon=True)
        self._thread.start()
        log.info("local engine started: %d KV blocks, max_model_len %d (the KV cache holds "
                 "%d tokens of one sequence)", self._blocks.num_blocks, self.max_model_len,
                 self._blocks.longest_sequence(self.max_model_len))

    def longest_sequence(self) -> int:
        """The most tokens (prompt + output) one request may ask for: max_model_len, or less
        where the KV cache cannot hold that many of one sequence (EngineOverloaded past it)."""
        return self._blocks.longest_sequence(self.max_model_len)

    async def shutdown(self) -> None:
        with self._cond:
            self._accepting = False
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        with self._cond:
            self._apply_commands()
            for seq in [*self._scheduler.running, *self._scheduler.waiting]:
                self._scheduler.finish(seq, "abort")
            for seq_id in list(self._streams):
                self._send(seq_id, EngineStopped("engine shut down"))
        log.info("local engine stopped")

    def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
        """Validate now (raising EngineError / EngineOverloaded / EngineStopped before any
        streaming starts), then stream. The request is queued on the first iteration."""
        if not self._accepting:
            raise EngineStopped("engine is shutting down")
        seq = self._make_sequence(req)
        self._scheduler.check_fits(seq)
        return self._stream(seq)

    def head_load(self) -> dict[str, HeadLoad]:
        with self._cond:
            counts = self._scheduler.head_counts()
            pending = [s.head for s in self._inbox]
        return {
            h: HeadLoad(counts.get(h, (0, 0))[0], counts.get(h, (0, 0))[1] + pending.count(h))
            for h in self.model.heads
        }

    # Block figures for callers are in blocks over all layers (block_size tokens of every
    # layer's K and V): the pool's blocks hold one KV group each, so they are divided by the
    # number of groups. A sequence on a model with sliding-window groups holds fewer of them
    # than its token count says; a block shared through the prefix cache counts once.

    def free_blocks(self) -> int:
        with self._cond:
            used = self._blocks.num_blocks - self._blocks.num_free
        return self.total_blocks() - -(-used // self.layout.num_groups)

    def total_blocks(self) -> int:
        return self._blocks.num_blocks // self.layout.num_groups

    def kv_bytes_held(self) -> int:
        """Bytes of KV the running sequences hold now (shared blocks once)."""
        with self._cond:
            used = self._blocks.num_blocks - self._blocks.num_free
        return used * self._runner.block_bytes

    def prefix_cache_counts(self) -> dict[str, tuple[int, int]]:
        """-> {head: (prompt tokens queried, prompt tokens found)} at first admissions."""
        with self._cond:
            stats = self._blocks.stats
            return {h: (q, stats.hits.get(h, 0)) for h, q in stats.queries.items()}

    def kernel_counts(self) -> dict[tuple[str, str], int]:
        """Head groups unembedded so far, per (head, kernel)."""
        return self._runner.kernel_counts()

    def prompt_score_seconds(self) -> float:
        """Total time spent scoring prompts (live BPB) so far."""
        return self._runner.score_seconds

    def quality_seconds(self) -> tuple[float, float]:
        """Time the measured quality control spent so far: (measuring prompts, inside
        prefill steps; probing, inside decode steps)."""
        q = self._runner.quality
        return q.prefill_seconds, q.probe_seconds

    def drafting_tallies(self) -> dict[str, DraftTally]:
        """Exact drafting so far, per drafter: drafts judged and accepted, verifies, the
        tokens they committed and their seconds."""
        return self._runner.drafting.tallies()

    def draft_k(self) -> int:
        """The k the last drafting step chose (heads.engine.drafting)."""
        return self._runner.drafting.last_k

    def drain_step_timings(self) -> list[StepTiming]:
        """Step timings since the last call (one reader: the gateway's calibration)."""
        out = []
        while self._timings:  # deque pops are atomic; the step thread only appends
            out.append(self._timings.popleft())
        return out

    def _make_sequence(self, req: GenerationRequest) -> Sequence:
        head = self.model.heads.get(req.head)
        if head is None:
            raise EngineError(f"unknown head {req.head!r}; have {sorted(self.model.heads)}")
        if not req.prompt_ids:
            raise EngineError("prompt_ids must not be empty")
        if not all(0 <= t < head.vocab_size for t in req.prompt_ids):
            raise EngineError(f"prompt ids outside [0, {head.vocab_size}) for head {req.head!r}")
        if req.max_tokens < 1:
            raise EngineError("max_tokens must be >= 1")
        constraint = None
        if req.structured is not None:
            if self.grammars is None:
                raise EngineUnsupported("this engine was started without a grammar compiler")
            constraint = self.grammars.constraint(req.structured)  # compiled at planning
        seq = Sequence(
            request_id=req.request_id, head=req.head, prompt_ids=list(req.prompt_ids),
            params=req.sampling, max_tokens=req.max_tokens,
            stop_token_ids=frozenset(req.stop_token_ids), want_logprobs=req.want_logprobs,
            score_prompt=req.score_prompt, score_positions=max(0, req.score_positions),
            top_logprobs=req.top_logprobs, prompt_logprobs=req.prompt_logprobs,
            constraint=constraint, rules=req.rules,
        )
        reading = self.readings.get(req.head)
        if reading is not None:
            reading.refuse(seq)
        if req.ladder is not None:
            self._check_ladder(req)
            seq.quality = LadderState(req.ladder)
        if req.drafter is not None:
            self._check_drafter(req)
            if _can_draft(seq):
                seq.draft = DraftState(req.drafter, req.head)
        return seq

    def _check_drafter(self, req: GenerationRequest) -> None:
        native = self.model.manifest.native.name
        if req.head != native or req.drafter not in self.readings or req.ladder is not None:
            raise EngineError(f"exact drafting runs on the native head ({native!r}) with a "
                              f"served reading as its drafter ({sorted(self.readings)}) and "
                              f"no ladder; got head {req.head!r}, drafter {req.drafter!r}")

    def _check_ladder(self, req: GenerationRequest) -> None:
        assert req.ladder is not None
        rungs, native = req.ladder.rungs, self.model.manifest.native.name
        if rungs[0] != req.head or rungs[-1] != native \
                or not all(r in self.readings for r in rungs[:-1]):
            raise EngineError(f"a ladder runs from the request's head ({req.head!r}) through "
                              f"served readings to the native head ({native!r}); got {rungs}")

    async def _stream(self, seq: Sequence) -> AsyncIterator[TokenEvent]:
        queue: asyncio.Queue[TokenEvent | EngineError] = asyncio.Queue()
        with self._cond:
            if not self._accepting:
                raise EngineStopped("engine is shutting down")
            self._streams[seq.seq_id] = (asyncio.get_running_loop(), queue)
            self._inbox.append(seq)
            self._cond.notify()
        done = False
        try:
            while not done:
                item = await queue.get()
                if isinstance(item, EngineError):
                    done = True
                    raise item
                done = item.finish_reason is not None
                yield item
        finally:
            # Reached on normal completion, on an error, and when the consumer stops early
            # (aclose, cancellation, GeneratorExit): in the last case free the KV blocks.
            with self._cond:
                self._streams.pop(seq.seq_id, None)
                if not done:
                    self._aborts.append(seq)
                    self._cond.notify()

    # --- step thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        self._runner.enter_step_thread()
        while True:
            with self._cond:
                if not (self._stopping or self._inbox or self._aborts
                        or not self._scheduler.is_idle):
                    # idle: its OpenMP workers would throttle another thread's (another
                    # engine in this process); the next step starts them again (~50 µs)
                    self._runner.release_openmp_workers()
                while not (self._stopping or self._inbox or self._aborts
                           or not self._scheduler.is_idle):
                    self._cond.wait()
                if self._stopping:
                    return
            self._step()

    def _step(self) -> None:
        seqs: list[Sequence] = []
        try:
            with self._cond:
                self._apply_commands()
                seqs, is_prefill = self._scheduler.schedule()
            if not seqs:
                return
            started = time.perf_counter()
            out = self._runner.run(seqs, is_prefill)
            if not any(s.draft is not None for s in seqs):  # drafting prices its own steps
                self._timings.append(_timing(seqs, out.measured, time.perf_counter() - started))
            with self._cond:
                results = self._scheduler.postprocess(seqs, out.token_ids, out.drafts)
                none = [None] * len(seqs)
                scores = out.prompt_scores or none
                tops = out.tops or none
                prompts = out.prompt_logprobs or none
                drafts = out.drafts or none
                for seq, lp, (committed, reason), score, top, plps, d in zip(
                        seqs, out.logprobs, results, scores, tops, prompts, drafts,
                        strict=True):
                    lps = d.logprobs if d is not None and d.row is None else (lp,)
                    before = len(seq.output_ids) - len(committed)
                    for j, tok in enumerate(committed):
                        first = before + j == 0
                        last = j == len(committed) - 1
                        cached = seq.cached_prompt_tokens if first else None
                        event = TokenEvent(
                            tok, lps[j] if seq.want_logprobs else None,
                            reason if last else None, score if first else None, cached,
                            top if j == 0 else None, plps if first else None)
                        if seq.quality is not None:
                            event = _with_ladder(event, seq, first)
                        self._send(seq.seq_id, event)
        except Exception as e:
            log.exception("engine step failed; failing its requests")
            with self._cond:
                # After a failure inside schedule() the bookkeeping is suspect: fail everyone.
                victims = seqs or [*self._scheduler.running, *self._scheduler.waiting]
                for seq in victims:
                    self._scheduler.finish(seq, "abort")
                    self._send(seq.seq_id, EngineError(f"engine step failed: {e!r}"))
                self._blocks.reset_cache()  # blocks keyed this step may never have been written

    def _apply_commands(self) -> None:
        # Callers hold _cond. Adds first, so an abort that overtook its add still finds it.
        for seq in self._inbox:
            self._scheduler.add(seq)
        self._inbox.clear()
        for seq in self._aborts:
            self._scheduler.finish(seq, "abort")
        self._aborts.clear()

    def _send(self, seq_id: int, item: TokenEvent | EngineError) -> None:
        # Callers hold _cond. A consumer that has gone away has no stream any more.
        stream = self._streams.get(seq_id)
        if stream is None:
            return
        loop, queue = stream
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # its event loop is closed
            self._streams.pop(seq_id, None)


def _can_draft(seq: Sequence) -> bool:
    """Whether a sequence's options survive drafting. A grammar, logit rules, alternatives
    and prompt scores need the native head's whole row at every step, so such a sequence
    runs natively (still exact, at the native head's speed)."""
    return (seq.constraint is None and not seq.rules.shapes and seq.top_logprobs == 0
            and seq.prompt_logprobs is None and not seq.score_prompt)


def _with_ladder(event: TokenEvent, seq: Sequence, first: bool) -> TokenEvent:
    """The event with the head that sampled it, the prompt's measured losses (first event)
    and the moves not yet reported."""
    state = seq.quality
    assert state is not None
    losses = (tuple(sorted(state.prompt_losses.items()))
              if first and state.prompt_losses is not None else None)
    moves, state.pending = tuple(state.pending), []
    return dataclasses.replace(event, head=seq.head, prompt_losses=losses, moves=moves)


def _timing(seqs: list[Sequence], measured: list[int] | None, seconds: float) -> StepTiming:
    """measured: None for a decode step; per sequence, the prompt positions measured for a
    prefill. Called before postprocess, so num_cached_tokens is still this prefill's."""
    ctx: dict[str, list[int]] = {}
    prompts: dict[str, tuple[int, int]] = {}
    for i, seq in enumerate(seqs):
        ctx.setdefault(seq.head, []).append(seq.num_tokens)
        if measured is not None:
            tokens, positions = prompts.get(seq.head, (0, 0))
            prompts[seq.head] = (tokens + seq.num_tokens - seq.num_cached_tokens,
                                 positions + measured[i])
    groups = tuple((h, len(n), sum(n) / len(n)) for h, n in ctx.items())
    return StepTiming(measured is not None, groups, seconds,
                      tuple((h, t, m) for h, (t, m) in prompts.items()))
