"""Replay one trace for every policy and static head, then simulate the same trace.

The simulator runs on this CPU's roofline with the engine's own KV budget and batch cap. Its
router always decides with what the real router starts from (the calibration file, or the
analytic floors); two columns charge it differently: by that same timer (self-scored, as
the policies minimize it) and by a timer fitted afterwards to every decode step the real
runs measured (a timer no policy optimized). Traces with languages are spelled per head
from the committed samples, as the real runs tokenize them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from heads.model.weights import Checkpoint
from router.cost import AnalyticTimer, StepTimer
from router.simulate.compare import compare, policy_doc
from router.simulate.traces import SimRequest
from router.step_time_file import seed_timer, timer_from_file
from router.step_time_fit import FittedStepTimer
from server.bench.replay.prompts import spellings
from server.bench.replay.report import Compared
from server.bench.replay.runner import ReplayConfig, Replayer, ReplayResult
from server.bootstrap import device_spec, head_profiles

log = logging.getLogger(__name__)


async def replay_all(ckpt: Checkpoint, trace: Sequence[SimRequest], policies: Sequence[str],
                     cfg: ReplayConfig, regime_of: Callable[[float], str],
                     calibration: Path | None = None, rounds: int = 1,
                     score: bool = True, concurrency: int | None = None,
                     simulate: bool = True, statics: Sequence[str] | None = None,
                     score_stride: int = 1) -> list[Compared]:
    """`rounds` > 1 replays every label that many times, interleaved (A B C A B C ...), so
    slow drifts of a shared machine hit every label alike; each label keeps its median-cost
    run and all of them (`Compared.runs`, for the run's noise). `score`: the served quality
    of every run (server.bench.replay.quality), on every `score_stride`-th request of the
    trace (the same ones for every label). `concurrency`: closed loop at that many requests
    in flight (Replayer.run). `statics`: the static heads to run (default every head).
    `simulate`: also the simulator's prediction (open loop only)."""
    profiles = head_profiles(ckpt.manifest, ckpt.model.dtype_name,  # priced as the engine runs
                             probe_every=cfg.probe_every if cfg.measured_quality else None,
                             measure_positions=cfg.positions)
    device = device_spec("auto")
    heads = [p.name for p in profiles]
    static = list(heads if statics is None else statics)

    def new_timer() -> StepTimer:
        # As the gateway: calibrated live from the engine's steps, seeded from the file.
        if calibration is not None:
            return timer_from_file(calibration, device, profiles)
        return FittedStepTimer(device, profiles)

    replayer = Replayer(ckpt, profiles, cfg, new_timer)
    await replayer.warm_up()
    runs: dict[str, list[ReplayResult]] = {}
    try:
        for i in range(rounds):
            for name in (*policies, *static):
                label = f"static:{name}" if name in static else name
                res = await replayer.run(trace, policy_doc(name, heads), label, regime_of,
                                         concurrency)
                runs.setdefault(label, []).append(res)
                log.info("replay %s (round %d/%d): %.4g s/MB, %d requests, %d steps", label,
                         i + 1, rounds, res.result.cost_s_per_mb, len(res.result.latencies),
                         res.result.steps)
        real = {label: sorted(rs, key=lambda r: r.result.cost_s_per_mb)[len(rs) // 2]
                for label, rs in runs.items()}
        if score:  # after the timed runs, so scoring never competes with them for the CPU
            replayer.score(trace, {(s.index, h) for rs in runs.values() for res in rs
                                   for s in res.served if s.index % score_stride == 0
                                   for h in s.heads})
            for res in (res for rs in runs.values() for res in rs):
                res.bpb = [replayer.served_bpb(s) if s.index % score_stride == 0 else math.nan
                           for s in res.served]
        langs = {r.lang for r in trace}
        texts = spellings(replayer.encoder, langs) if langs != {"en"} else None
    finally:
        await replayer.close()
    if not simulate:
        return [Compared(label, res, {}, tuple(runs[label])) for label, res in real.items()]

    fitted = FittedStepTimer(device, profiles)
    seed_timer(fitted, (s for res in real.values() for s in res.decode_steps))
    start: StepTimer = (timer_from_file(calibration, device, profiles) if calibration
                        else AnalyticTimer(device))
    # The simulated router always decides with `start`; the second column charges it the
    # step times the real runs measured, which it does not minimize.
    sim_timers = {"sim (calibration file)" if calibration else "sim (analytic)": start,
                  "sim (charged measured)": fitted}
    sims = {lab: {row.policy: row.result for row in compare(
                trace, "replay", device, profiles, cfg.lambda_forecast, policies, start,
                kv=replayer.kv_tokens, max_num_seqs=cfg.max_num_seqs, score_timer=score,
                texts=texts)}
            for lab, score in sim_timers.items()}
    return [Compared(label, res, {lab: sims[lab][label] for lab in sims}, tuple(runs[label]))
            for label, res in real.items()]
