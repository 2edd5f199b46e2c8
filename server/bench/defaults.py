"""`polyhead serve` at its defaults against the heads it could pin, on one server, measured
with vLLM's own `vllm bench serve`.

Labels, each on the same prompts, one after the other, in rounds:
- `router`: the default model name, the default policy;
- `exact`: the same name with the policy's max_bpb_loss set to 0 through the admin API (the
  native head writes every token, a reading drafts: heads.engine.drafting), then restored;
- `pinned:<head>`: the per-head route of each head (the native head, the second largest,
  each reading).

Per prompt set and concurrency: output bytes/s per label and round, the spread over rounds
(the machine's noise), the ratios the targets name, and how many of the exact label's texts
equal the pinned native head's (greedy: they must all be equal, but for near-ties).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

DATA = Path(__file__).parent / "data"
PROMPT_SETS = {"mixed": DATA / "prompts_mixed.jsonl", "python": DATA / "prompts_python.jsonl"}
ROUTER, EXACT = "router", "exact"
# (label, against, prompt set, concurrency, target ratio): what the router's default and the
# exact mode must reach against a head an operator could pin instead.
TARGETS: tuple[tuple[str, str, str, int, float], ...] = (
    (ROUTER, "second", "mixed", 1, 1.0),
    (ROUTER, "second", "mixed", 16, 1.0),
    (ROUTER, "second", "python", 1, 1.15),
    (EXACT, "native", "mixed", 1, 1.25),
)


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    prompts: str
    concurrency: int
    round: int
    bytes_s: float
    completed: int
    failed: int
    texts: tuple[str, ...]


def run_of(label: str, prompts: str, concurrency: int, index: int, r: dict) -> Run:
    texts = tuple(r.get("generated_texts", []))
    return Run(label, prompts, concurrency, index,
               sum(len(t.encode()) for t in texts) / r["duration"], r["completed"],
               r.get("failed", 0), texts)


def exact_policy(url: str, token: str) -> Callable[[], None]:
    """Switch the live policy to its own parameters with max_bpb_loss 0; -> the undo."""
    auth = {"authorization": f"Bearer {token}"}
    before = httpx.get(f"{url}/admin/policy", headers=auth, timeout=10).json()
    params = {**before["params"], "max_bpb_loss": 0}
    r = httpx.put(f"{url}/admin/policy", headers=auth, timeout=10,
                  json={"name": before["name"], "params": params})
    r.raise_for_status()

    def undo() -> None:
        httpx.put(f"{url}/admin/policy", headers=auth, timeout=10,
                  json={"name": before["name"], "params": before["params"]}).raise_for_status()
    return undo


def mean_bytes(runs: list[Run], label: str, prompts: str, c: int) -> tuple[float, float]:
    """(mean, spread as (max - min) / mean) of a label's bytes/s over its rounds."""
    vals = [r.bytes_s for r in runs if (r.label, r.prompts, r.concurrency) == (label, prompts, c)]
    if not vals:
        return float("nan"), float("nan")
    mean = statistics.fmean(vals)
    return mean, (max(vals) - min(vals)) / mean if mean else float("nan")


def verdicts(runs: list[Run], names: dict[str, str]) -> list[str]:
    """`names`: "native" and "second" -> their pinned labels."""
    lines = []
    for label, against, prompts, c, target in TARGETS:
        base = names[against]
        ours, noise = mean_bytes(runs, label, prompts, c)
        theirs, base_noise = mean_bytes(runs, base, prompts, c)
        if ours != ours or theirs != theirs:  # nan: not run
            lines.append(f"NOT MEASURED {label} {prompts} c={c} against {base}")
            continue
        ratio = ours / theirs if theirs else float("nan")
        failed = sum(r.failed for r in runs if r.label in (label, base) and r.prompts == prompts
                     and r.concurrency == c)
        lines.append(f"{'MET' if ratio >= target and not failed else 'MISSED'} {label} "
                     f"{prompts} c={c}: bytes/s {ratio:.2f}x {base} (target >= {target}x; "
                     f"round spread {noise:.0%} / {base_noise:.0%})"
                     + (f"; {failed} requests failed" if failed else ""))
    return lines


def exactness(runs: list[Run], native: str) -> list[str]:
    """Per prompt set and concurrency: the exact label's texts equal to the pinned native
    head's, in the same round (greedy both)."""
    lines = []
    for r in runs:
        if r.label != EXACT:
            continue
        base = next((b for b in runs if (b.label, b.prompts, b.concurrency, b.round)
                     == (native, r.prompts, r.concurrency, r.round)), None)
        if base is None or len(base.texts) != len(r.texts):
            continue
        same = sum(a == b for a, b in zip(r.texts, base.texts, strict=True))
        lines.append(f"exact {r.prompts} c={r.concurrency} round {r.round}: {same} of "
                     f"{len(r.texts)} texts equal {native}'s")
    return lines


def table(runs: list[Run], labels: list[str], names: dict[str, str]) -> str:
    rounds = sorted({r.round for r in runs})
    head = f"{'prompts':<8}{'c':>4} {'label':<22}" + "".join(
        f"{f'round {i} B/s':>14}" for i in rounds) + f"{'spread':>8}{'vs 2nd':>8}{'vs nat':>8}"
    rows = [head]
    for prompts in PROMPT_SETS:
        for c in sorted({r.concurrency for r in runs}):
            second, _ = mean_bytes(runs, names["second"], prompts, c)
            native, _ = mean_bytes(runs, names["native"], prompts, c)
            for label in labels:
                by_round = {r.round: r.bytes_s for r in runs
                            if (r.label, r.prompts, r.concurrency) == (label, prompts, c)}
                if not by_round:
                    continue
                mean, spread = mean_bytes(runs, label, prompts, c)
                rows.append(f"{prompts:<8}{c:>4} {label:<22}" + "".join(
                    f"{by_round.get(i, float('nan')):>14.1f}" for i in rounds)
                    + f"{spread:>8.0%}{mean / second:>8.2f}{mean / native:>8.2f}")
    return "\n".join(rows)


def write(runs: list[Run], lines: list[str], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "defaults.json"
    path.write_text(json.dumps({"runs": [_record(r) for r in runs], "verdicts": lines},
                               indent=2))
    return path


def _record(r: Run) -> dict:
    return {"label": r.label, "prompts": r.prompts, "concurrency": r.concurrency,
            "round": r.round, "bytes_s": r.bytes_s, "completed": r.completed,
            "failed": r.failed}
