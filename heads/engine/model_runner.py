"""Runs one scheduled step: builds the tensors, runs the shared backbone once for the whole
mixed-head batch, then unembeds and samples: once per head group, or, for groups whose heads
are prefixes of one matrix, in one pass over the largest one's rows when
`kernels.nested_plan` (the rule the router's cost model prices) finds that cheaper."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

import torch

from heads.engine.config import EngineConfig
from heads.engine.cpu_linear import pack_linears, packing_available
from heads.engine.drafting import DraftOutcome, DraftPlanner, accepted_prefix, drafters_of
from heads.engine.grouped_reading import GroupedReading
from heads.engine.logit_rules import few_id_changes, row_biases
from heads.engine.logprob_tops import prompt_tops, sampled_tops
from heads.engine.prompt_score import ScoreJob, score_prompts
from heads.engine.quality_control import QualityController
from heads.engine.row_sampler import needs_row, sample_row
from heads.engine.sequence import Sequence
from heads.engine.types import PromptScore, TokenLogprobs
from heads.model.adapter import HeadOutput
from heads.model.attention import AttentionMetadata, allocate_kv_cache, slots_for
from heads.model.multi_head import MultiHeadModel
from heads.model.native import build as native_build
from kernels import huge_pages, int_groups, nested, onednn_gemm, precision
from kernels.crossover_calibration import load_calibration
from kernels.dispatch import batch_mode, device_spec, dtype_name, run_plan
from kernels.nested_plan import GroupShape, effective_batch, plan_nested
from kernels.packed_rows import PackedRows, RowPacker, packing_supported
from kernels.sampling_params import SampleOutput, SamplingBatch
from kernels.selector import Selector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepOutput:
    token_ids: list[int]  # one per scheduled sequence, in schedule order
    logprobs: list[float | None]  # None where the sequence did not ask for logprobs
    # Set at a sequence's first prefill when it asked for its prompt's NLL; else None.
    prompt_scores: list[PromptScore | None] | None = None
    # Where asked for (heads.engine.logprob_tops); None when no sequence asked.
    tops: list[TokenLogprobs | None] | None = None
    prompt_logprobs: list[tuple[TokenLogprobs, ...] | None] | None = None
    # Exact drafting (heads.engine.drafting): per sequence, None where it is not drafting.
    drafts: list[DraftOutcome | None] | None = None
    # Prefill: per sequence, the prompt positions the measured quality control scored.
    measured: list[int] | None = None


class ModelRunner:
    def __init__(self, model: MultiHeadModel, config: EngineConfig, num_blocks: int,
                 readings: dict[str, GroupedReading] | None = None) -> None:
        self.model = model
        self.readings = readings or {}  # name -> a two-level reading served as a head
        self.block_size = config.block_size
        self.device = torch.device(config.device)
        model.to(self.device)
        self.flush_denormals = config.flush_denormals
        before = huge_pages.mappings()  # what appears from here on: packed weights, KV cache
        # Loaded before packing: the packed products take its GEMV (kernels.onednn_gemm).
        fused = config.cpu_fused_ops and self.device.type == "cpu" and native_build.load()
        if hasattr(model.backbone, "fused_ops"):
            setattr(model.backbone, "fused_ops", fused)  # noqa: B010
        guessed = device_spec(self.device)
        calibration = load_calibration(guessed.name)
        self.packed_rows: dict[str, PackedRows] = {}  # head -> its rows in oneDNN blocks
        # Products of at most this many rows read the source file's integer groups where the
        # checkpoint has them (kernels.precision); 0 without any.
        self.int8_rows = precision.int8_rows(
            config.weights, None if calibration is None else calibration.int8_rows()
        ) if model.int8 and int_groups.gemv_available() else 0
        if config.cpu_packed_weights and packing_available(self.device, model.dtype):
            provider = onednn_gemm.resolve(config.cpu_gemm, model.dtype)
            log.info("packed %d backbone projections for %s's oneDNN",
                     pack_linears(model.backbone, provider, model.int8, self.int8_rows),
                     provider)
            self.packed_rows = _pack_heads(model, provider, self.int8_rows)
            if self.int8_rows:
                log.info("products of at most %d rows read the file's integer groups (%d "
                         "tensors, %.1f MiB; weights=%s)", self.int8_rows, len(model.int8),
                         sum(g.nbytes for g in model.int8.values()) / 2**20, config.weights)
        b = model.manifest.backbone
        self.layout = config.layout(b)
        self.pad = num_blocks  # the spare block (heads.engine.block_manager)
        # One K/V pair per slot of a group, num_blocks + 1 blocks each; layer l uses slot
        # layer_slot[l] through its group's block tables.
        slots = allocate_kv_cache(
            self.layout.group_size, num_blocks + 1, config.block_size, b.num_kv_heads,
            b.head_dim, model.dtype, self.device,
        )
        self.kv_cache = [slots[j] for j in self.layout.layer_slot]
        self.block_bytes = sum(k[0].nbytes + v[0].nbytes for k, v in slots)  # one pool block
        if config.cpu_huge_pages and self.device.type == "cpu":
            # Read whole (weights) or in long runs (KV blocks) every decode step: on 4 KiB
            # pages the demo's 131k step took 15% longer at B=1, 10% at B=16 (one thread).
            t0 = time.perf_counter()
            moved = huge_pages.back(huge_pages.mappings() - before)
            log.info("packed weights and KV cache on huge pages: %.0f MiB in %.1f s",
                     moved / 2**20, time.perf_counter() - t0)
        log.info(
            "KV cache: %d blocks of %d tokens x %d layers (%d groups), %.1f MiB", num_blocks,
            config.block_size, self.layout.group_size, self.layout.num_groups,
            sum(k.nbytes + v.nbytes for k, v in slots) / 2**20,
        )
        # The measured roofline where `kernels calibrate` ran: what the router prices too.
        self.device_spec = guessed if calibration is None else calibration.roofline(guessed)
        self.selector = Selector(calibration)
        self.nested_heads = config.nested_heads
        self._kernel_counts: Counter[tuple[str, str]] = Counter()  # (head, kernel) -> groups
        self._counts_lock = threading.Lock()
        self.score_seconds = 0.0  # total time in prompt scoring (what live BPB costs)
        self.native = model.manifest.native.name
        packed = self.packed_rows.get(self.native)
        plain = model.head_output(self.native)
        if plain.bias is not None or plain.down is not None:  # adapted: not the rows alone
            packed = None
        self.quality = QualityController(model.head_output, self.readings, self.native,
                                         packed.logits if packed is not None else None)
        self.drafting = DraftPlanner(fixed_k=config.num_draft_tokens)

    def release_openmp_workers(self) -> None:
        """Releases the calling thread's OpenMP workers (heads/model/native/thread_pool.cpp):
        the thread that built this runner before another one steps it, and the step thread
        when it goes idle. Left parked, they make libgomp manage more threads than CPUs, and
        it then sleeps the stepping thread's workers between the step's ~80 parallel
        regions: on 2 cores the backbone's products took 1.8x as long."""
        if self.device.type == "cpu" and hasattr(torch.ops.polyhead, "release_thread_pool"):
            torch.ops.polyhead.release_thread_pool()

    def enter_step_thread(self) -> None:
        """Per-thread settings for the thread that calls run (the engine's step thread)."""
        if self.flush_denormals:
            torch.set_flush_denormal(True)  # x86 only; a no-op returning False elsewhere

    def kernel_counts(self) -> dict[tuple[str, str], int]:
        with self._counts_lock:
            return dict(self._kernel_counts)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _per_layer(self, metas: list[AttentionMetadata]) -> list[AttentionMetadata]:
        return [metas[g] for g in self.layout.layer_group]

    def _prepare_prefill(
        self, seqs: list[Sequence]
    ) -> tuple[list[int], list[int], list[AttentionMetadata], list[int]]:
        # A prefill covers a sequence's tokens after its cached prefix: the prompt, plus its
        # outputs after a preemption by recompute.
        ids: list[int] = []
        positions: list[int] = []
        lens: list[int] = []
        cached = [s.num_cached_tokens for s in seqs]
        for seq, c in zip(seqs, cached, strict=True):
            ids += seq.token_ids[c:]
            positions += range(c, seq.num_tokens)
            lens.append(seq.num_tokens - c)
        last = [x - 1 for x in itertools.accumulate(lens)]  # each sequence's last row
        metas = []
        for g in range(self.layout.num_groups):
            slots = [x for s, c in zip(seqs, cached, strict=True)
                     for x in slots_for(s.block_tables[g], c, s.num_tokens, self.block_size)]
            tables = self._tables([s.block_tables[g] for s in seqs]) if any(cached) else None
            metas.append(AttentionMetadata.prefill(lens, self._tensor(slots), cached, tables))
        return ids, positions, self._per_layer(metas), last

    def _tables(self, rows: list[list[int]]) -> torch.Tensor:
        # -> [B, max_blocks] int64, padded with the pad block (masked by length)
        width = max(len(r) for r in rows)
        flat = [i for r in rows for i in r + [self.pad] * (width - len(r))]
        return self._tensor(flat).view(len(rows), width)

    def _prepare_decode(
        self, seqs: list[Sequence]
    ) -> tuple[list[int], list[int], list[AttentionMetadata], list[int]]:
        ids = [seq.last_token for seq in seqs]
        positions = [seq.num_tokens - 1 for seq in seqs]
        bs = self.block_size
        metas = []
        for g, window in enumerate(self.layout.windows):
            tables = [s.block_tables[g] for s in seqs]
            slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)]
            # A sliding group's rows start at their first live block, so the gather reads
            # the window and not the whole context; keys only count relative to the context
            # length, so shifting a row by its first block changes nothing else.
            starts = [0 if window is None else max(0, p + 1 - window) // bs for p in positions]
            ctx = [p + 1 - lo * bs for p, lo in zip(positions, starts, strict=True)]
            metas.append(AttentionMetadata.decode(
                self._tensor(slots),
                self._tables([t[lo:] for t, lo in zip(tables, starts, strict=True)]),
                self._tensor(ctx), (min(ctx), max(ctx)),
            ))
        return ids, positions, self._per_layer(metas), list(range(len(seqs)))

    def _embed(self, heads: list[str], ids: torch.Tensor) -> torch.Tensor:
        # heads: one name per token; ids: [T] -> [T, d], gathered per head group
        if len(set(heads)) == 1:
            return self.model.embed(heads[0], ids)
        x = torch.empty(
            (ids.shape[0], self.model.manifest.backbone.hidden_size),
            dtype=self.model.dtype, device=self.device,
        )
        for head, rows in _groups(heads).items():
            idx = self._tensor(rows)
            x[idx] = self.model.embed(head, ids[idx])
        return x

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> StepOutput:
        step_started = time.perf_counter()
        self.drafting.plan(seqs)  # drafting sequences: on their drafter, or verifying
        prepare = self._prepare_prefill if is_prefill else self._prepare_decode
        ids, positions, meta, last = prepare(seqs)
        token_heads = (
            [s.head for s in seqs for _ in range(s.num_tokens - s.num_cached_tokens)] if is_prefill
            else [s.head for s in seqs]
        )
        x = self._embed(token_heads, self._tensor(ids))  # [T, d]
        hidden = self.model(x, self._tensor(positions), meta, self.kv_cache)  # [T, d]
        scores = self._score(seqs, hidden, last) if is_prefill else None
        prompt_lps = (prompt_tops(hidden, seqs, last, self.model.head_output) if is_prefill
                      else None)
        measured = [0] * len(seqs) if is_prefill else None
        if measured is not None:  # laddered sequences start on the rung their prompt earns
            for i, s in enumerate(seqs):
                if s.quality is not None and s.quality.prompt_losses is None:
                    first = last[i] - (s.num_tokens - s.num_cached_tokens) + 1
                    measured[i] = self.quality.at_prefill(s, hidden[first:last[i] + 1],
                                                          s.num_cached_tokens)
        hidden = hidden[self._tensor(last)]  # [B, d]: the last token of each sequence
        if not is_prefill and any(s.quality is not None for s in seqs):
            self.quality.at_decode(seqs, hidden)  # may move a sequence before it samples

        rows = _Rows.of(seqs, hidden)
        started = time.perf_counter()
        tokens, lps = self._unembed(rows)
        drafts = (self._drafts(seqs, rows, tokens, lps, time.perf_counter() - started)
                  if rows.drafting else None)
        token_ids, logprobs = tokens[:len(seqs)], lps[:len(seqs)]
        tops = sampled_tops(hidden, seqs, token_ids, self.model.head_output)
        if drafts is not None and not is_prefill and all(
                s.draft is not None or s.head == self.native for s in seqs):
            # what the planner prices k with: this batch's step at this many native rows
            self.drafting.costs.observe(drafters_of(seqs), len(seqs),
                                        rows.heads.count(self.native),
                                        time.perf_counter() - step_started)
        return StepOutput(token_ids, logprobs, scores, tops, prompt_lps, drafts, measured)

    def _drafts(self, seqs: list[Sequence], rows: _Rows, tokens: list[int],
                lps: list[float | None], seconds: float) -> list[DraftOutcome | None]:
        """What each drafting sequence's step did: drafted a token from its row, or verified
        its pending drafts (rows.extra) and the step's own row on the native head.
        `seconds`: the step's unembedding, shared among its verifies."""
        out: list[DraftOutcome | None] = [None] * len(seqs)
        share = seconds / max(1, len(rows.extra))
        for i, s in enumerate(seqs):
            if s.draft is None:
                continue
            if s.head != s.draft.native:
                out[i] = DraftOutcome(rows.hidden[i].clone())
                continue
            at = rows.extra.get(i, [])
            native = [tokens[j] for j in at] + [tokens[i]]  # row j: draft j's position
            drafts = s.output_ids[len(s.output_ids) - len(at):]
            n = accepted_prefix(drafts, native)
            tokens[i] = native[n]
            self.drafting.record(s.draft.drafter, min(n + 1, len(drafts)), n, share)
            kept = [lps[j] for j in [*at, i]][:n + 1]
            out[i] = DraftOutcome(None, n, tuple(kept))
        return out

    def _unembed(self, rows: _Rows) -> tuple[list[int], list[float | None]]:
        # rows.hidden: [R, d]: one row per sequence, then the pending drafts' rows of the
        # verifying sequences. Groups whose heads are prefixes of one matrix may share one
        # pass over the largest head's rows (kernels/nested.py).
        seqs, hidden = rows.owners, rows.hidden
        token_ids: list[int] = [0] * len(seqs)
        logprobs: list[float | None] = [None] * len(seqs)
        free = [i for i, s in enumerate(seqs) if not needs_row(s)]
        for i in range(len(seqs)):
            if needs_row(seqs[i]):  # a grammar or a logit rule needs the row's logits
                token_ids[i], logprobs[i] = sample_row(
                    self.model.head_output(seqs[i].head), hidden[i:i + 1], seqs[i])
        groups = [_Group(head, [free[j] for j in r], rows, self.model.head_output(head),
                         self.device)
                  for head, r in _groups([rows.heads[i] for i in free]).items()]
        for shared in _by_rows(groups).values():
            if len(shared) > 1 and self._nest(shared):
                self._run_nested(shared, hidden)
            else:
                for g in shared:
                    self._run_group(g, hidden)
        for g in groups:
            assert g.out is not None
            reading = self.readings.get(g.head)
            if reading is not None:  # the piece picked its group; the group's rows pick t
                g.out = reading.second_level(
                    self.model.head_output(self.native), hidden[self._tensor(g.rows)], g.out,
                    g.batch, coupled=torch.tensor([seqs[i].draft is not None for i in g.rows]))
            toks = g.out.token_ids.tolist()
            lps = g.out.logprobs.tolist() if g.out.logprobs is not None else [None] * len(g.rows)
            for i, t, lp in zip(g.rows, toks, lps, strict=True):
                token_ids[i] = t
                logprobs[i] = lp if seqs[i].want_logprobs else None
        return token_ids, logprobs

    def _run_group(self, g: _Group, hidden: torch.Tensor) -> None:
        weight = g.head_out.weight
        plan = self.selector.choose(
            len(g.rows), weight.shape[0], weight.shape[1], dtype_name(weight.dtype),
            batch_mode(g.batch, weight.shape[0]), self.device_spec,
        )
        with onednn_gemm.rows_as(g.sequences):  # a verify's rows read a plain step's bytes
            g.out = run_plan(plan, g.head_out.hidden(hidden[self._tensor(g.rows)]), weight,
                             g.batch, g.bias, self.packed_rows.get(g.head))
        self._count(g.head, plan.kernel)

    def _nest(self, groups: list[_Group]) -> bool:
        if self.nested_heads != "auto":
            return self.nested_heads == "always"
        weight = groups[0].head_out.weight
        batch = _concat([g.batch for g in groups])
        row_vocab = torch.tensor([g.vocab for g in groups for _ in g.rows])
        plan = plan_nested([GroupShape(len(g.rows), g.vocab) for g in groups],
                           weight.shape[1], dtype_name(weight.dtype),
                           batch_mode(batch, row_vocab), self.device_spec,
                           self.selector.calibration)
        return plan.nested

    def _run_nested(self, groups: list[_Group], hidden: torch.Tensor) -> None:
        top = max(groups, key=lambda g: g.vocab)
        weight, vmax = top.head_out.weight, top.vocab
        h = torch.cat([g.head_out.hidden(hidden[self._tensor(g.rows)]) for g in groups])
        row_vocab = self._tensor([g.vocab for g in groups for _ in g.rows])
        batch = _concat([g.batch for g in groups])
        bias = None
        biased = [g.bias.shape[-1] for g in groups if g.bias is not None]
        if biased:  # [B, widest bias]: the kernels add nothing past it
            bias = torch.zeros(h.shape[0], max(biased), dtype=torch.float32, device=self.device)
            at = 0
            for g in groups:
                if g.bias is not None:  # a head's [V] or per-row [n, Vb]
                    bias[at:at + len(g.rows), :g.bias.shape[-1]] = g.bias
                at += len(g.rows)
        b_eff = effective_batch([GroupShape(len(g.rows), g.vocab) for g in groups])
        plan = self.selector.choose(b_eff, vmax, weight.shape[1], dtype_name(weight.dtype),
                                    batch_mode(batch, row_vocab), self.device_spec)
        with onednn_gemm.rows_as(sum(g.sequences for g in groups)):
            out = nested.unembed_and_sample(plan.kernel, h, weight, row_vocab, batch, bias,
                                            self.packed_rows.get(top.head))
        at = 0
        for g in groups:
            n = len(g.rows)
            g.out = SampleOutput(out.token_ids[at:at + n],
                                 None if out.logprobs is None else out.logprobs[at:at + n])
            self._count(g.head, f"nested-{plan.kernel}")
            at += n

    def _count(self, head: str, kernel: str) -> None:
        with self._counts_lock:
            self._kernel_counts[(head, kernel)] += 1

    def _score(self, seqs: list[Sequence], hidden: torch.Tensor,
               last: list[int]) -> list[PromptScore | None] | None:
        # hidden: [T, d]; a sequence's rows end at last[i]. Only a first prefill is scored:
        # after a preemption by recompute its first token (and the score) went out already.
        # A scored prompt is never served from the prefix cache: all its rows are here.
        jobs = [(i, ScoreJob(s.head, last[i] - s.num_tokens + 1, s.prompt_ids,
                             s.score_positions, s.params.seed))
                for i, s in enumerate(seqs)
                if s.score_prompt and not s.output_ids and s.prompt_score is None]
        if not jobs:
            return None
        out: list[PromptScore | None] = [None] * len(seqs)
        started = time.perf_counter()  # score_prompts ends in a host sync: the time is real
        done = score_prompts(hidden, [j for _, j in jobs], self.model.head_output)
        self.score_seconds += time.perf_counter() - started
        for (i, _), score in zip(jobs, done, strict=True):
            seqs[i].prompt_score = out[i] = score
        return out


def _pack_heads(model: MultiHeadModel, provider: str, int8_rows: int) -> dict[str, PackedRows]:
    packer = RowPacker(provider=provider, int8_rows=int8_rows)
    out: dict[str, PackedRows] = {}
    seen: dict[tuple, PackedRows] = {}  # the same rows (a reading's, an unadapted head's) once
    for head in model.heads:
        weight = model.head_output(head).weight
        key = (weight.data_ptr(), tuple(weight.shape), weight.stride())
        if key in seen:
            out[head] = seen[key]
        elif packing_supported(weight):
            out[head] = seen[key] = packer.pack(weight, model.int8_prefix(weight))
    log.info("packed the rows of %d heads for oneDNN: %.1f MiB", len(out), packer.nbytes / 2**20)
    return out


@dataclass(frozen=True, slots=True)
class _Rows:
    """The rows a step unembeds: one per sequence (its last token), then each verifying
    sequence's pending drafts, sampled at the positions the drafts were sampled at."""

    hidden: torch.Tensor  # [R, d]
    owners: list[Sequence]  # [R]
    positions: list[int]  # [R]: index of the token each row samples
    heads: list[str]  # [R]
    extra: dict[int, list[int]]  # sequence index -> its draft rows' indices, in order
    drafting: bool

    @classmethod
    def of(cls, seqs: list[Sequence], hidden: torch.Tensor) -> _Rows:
        owners, positions = list(seqs), [s.num_tokens for s in seqs]
        heads = [s.head for s in seqs]
        parts, extra = [hidden], {}
        for i, s in enumerate(seqs):
            if s.draft is None or s.head != s.draft.native or not s.draft.pending:
                continue
            n = s.draft.pending
            extra[i] = list(range(len(owners), len(owners) + n))
            owners += [s] * n
            positions += range(s.num_tokens - n, s.num_tokens)
            heads += [s.head] * n
            parts.append(torch.stack(s.draft.rows).to(hidden.dtype))
        return cls(torch.cat(parts) if extra else hidden, owners, positions, heads, extra,
                   any(s.draft is not None for s in seqs))


class _Group:
    """One head's rows of a step, its sampling batch and what its logits come from."""

    def __init__(self, head: str, rows: list[int], step: _Rows, head_out: HeadOutput,
                 device: torch.device) -> None:
        self.head, self.rows, self.head_out = head, rows, head_out
        group = [step.owners[i] for i in rows]
        self.sequences = len({id(s) for s in group})  # fewer than rows where one verifies
        self.batch = SamplingBatch.from_rows(
            [s.params for s in group],
            [step.positions[i] for i in rows],  # index of the token being sampled
            want_logprobs=any(s.want_logprobs for s in group),
        )
        # The head's [V] bias, or [n, Vb] with the rows' few-id rules added (min_tokens'
        # stop ids, logit_bias, bad words); None without either.
        changes = [few_id_changes(s.rules, s.output_ids, s.stop_token_ids, self.vocab)
                   if s.rules.shapes else {} for s in group]
        self.bias = row_biases(changes, head_out.bias, device)
        self.out: SampleOutput | None = None

    @property
    def vocab(self) -> int:
        return int(self.head_out.weight.shape[0])


def _by_rows(groups: list[_Group]) -> dict[tuple, list[_Group]]:
    """Groups keyed by where their rows live: heads whose rows are a prefix of the same
    matrix (same first row, same row stride) share a key. A low-rank head owns a folded copy
    of its rows; a hidden-adapted head keeps the shared rows (its transform is per group)."""
    out: dict[tuple, list[_Group]] = {}
    for g in groups:
        w = g.head_out.weight
        key = (w.device, w.dtype, w.data_ptr(), w.stride(0), w.stride(1))
        out.setdefault(key, []).append(g)
    return out


def _concat(batches: list[SamplingBatch]) -> SamplingBatch:
    def cat(field: str) -> torch.Tensor:
        return torch.cat([getattr(b, field) for b in batches])

    return SamplingBatch(cat("temperature"), cat("top_p"), cat("top_k"), cat("seed"),
                         cat("position"), any(b.want_logprobs for b in batches))


def _groups(heads: list[str]) -> dict[str, list[int]]:
    """Row indices per head name, in first-seen order."""
    out: dict[str, list[int]] = {}
    for i, h in enumerate(heads):
        out.setdefault(h, []).append(i)
    return out
