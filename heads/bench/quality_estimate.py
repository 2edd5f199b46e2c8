"""How well the engine's prompt measurement predicts a reading's loss on what follows.

`python -m heads.bench.quality_estimate MODEL_DIR` cuts held-out documents of each content
class into a prompt and the continuation that really follows it. Predicted: each reading's
loss against the native head on `--positions` sampled prompt positions, exactly as the engine
measures a laddered request at its first prefill (QualityController.prompt_losses). Measured:
the same loss on every token of the continuation, the prompt as context. Per class and reading
it prints the median predicted and measured loss and the median absolute error, in
percentage points of BPB, and the head the ladder would start on, with the measured loss of
that choice. Nothing here was used to fit anything: the measurement has no parameters but
the number of positions.

Classes and their offline sources: prose (the committed Wikipedia samples), code and docs
(heads.corpus.content: this Python's standard library source and reference manual topics),
and each committed language sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from heads.corpus.content import CONTENT_CLASSES, content_text
from heads.corpus.languages import languages, sample
from heads.data.files import WIKI_SAMPLE_A, WIKI_SAMPLE_B
from heads.engine.grouped_reading import GroupedReading
from heads.engine.quality_control import QualityController, later_positions
from heads.engine.types import QualityLadder
from heads.model.forward import forward_hidden
from heads.model.weights import Checkpoint, load_checkpoint


def documents(cls: str, count: int, size: int) -> list[str]:
    """`count` texts of `size` characters of one class, each from a different place."""
    if cls == "prose":
        text = "\n".join(f.read_text(encoding="utf-8") for f in (WIKI_SAMPLE_A, WIKI_SAMPLE_B))
    elif cls in CONTENT_CLASSES:
        text = content_text(cls)
    else:
        text = sample(cls)
    stride = max(size, (len(text) - size) // count)
    return [text[i:i + size] for i in range(0, len(text) - size + 1, stride)][:count]


@torch.inference_mode()
def measure(ckpt: Checkpoint, controller: QualityController, ladder: QualityLadder,
            text: str, prompt_chars: int, seed: int) -> tuple[dict[str, float],
                                                            dict[str, float], float]:
    """-> (predicted loss per reading, measured loss per reading, seconds predicting)."""
    native = ckpt.manifest.native
    tok = ckpt.tokenizers[native.name]
    prompt, cont = tok.encode(text[:prompt_chars]), tok.encode(text[prompt_chars:])
    ids = ([] if native.bos_token_id is None else [native.bos_token_id]) + prompt
    hidden = forward_hidden(ckpt, native.name, ids + cont)  # [T, d]
    picks = later_positions(len(ids) - 1, ladder.positions, seed)
    t0 = time.perf_counter()
    predicted = controller.prompt_losses(hidden[picks], torch.tensor([ids[j + 1] for j in picks]),
                                         ladder.rungs)
    seconds = time.perf_counter() - t0
    expected = controller.expected_losses(hidden[picks], ladder.rungs)
    predicted.update({f"{r} kl": v for r, v in expected.items()})
    rows = hidden[len(ids) - 1:-1]  # predicts every continuation token
    measured = controller.prompt_losses(rows, torch.tensor(cont), ladder.rungs)
    return predicted, measured, seconds


def run(ckpt: Checkpoint, classes: list[str], docs: int, size: int, positions: int,
        bound: float) -> list[dict]:
    readings = GroupedReading.served(ckpt)
    for r in readings:
        ckpt.model.add_reading(r.name, r.head)
    order = sorted(readings, key=lambda r: r.vocab)
    native = ckpt.manifest.native.name
    ladder = QualityLadder((*(r.name for r in order), native), bound, positions=positions)
    controller = QualityController(ckpt.model.head_output, {r.name: r for r in readings},
                                   native)
    rows = []
    for cls in classes:
        preds, meas, secs, chosen = [], [], [], []
        for i, text in enumerate(documents(cls, docs, size)):
            p, m, s = measure(ckpt, controller, ladder, text, size // 2, i)
            preds.append(p)
            meas.append(m)
            secs.append(s)
            head = ladder.first_within(p)
            chosen.append((head, m.get(head, 0.0)))
        row: dict = {"class": cls, "docs": len(preds),
                     "predict_ms": round(1e3 * statistics.median(secs), 1)}
        for r in (*ladder.rungs[:-1], *(f"{r} kl" for r in ladder.rungs[:-1])):
            m_of = r.removesuffix(" kl")
            row[r] = {"predicted": statistics.median(p[r] for p in preds),
                      "measured": statistics.median(m[m_of] for m in meas),
                      "mae_pp": 100 * statistics.median(abs(p[r] - m[m_of])
                                                        for p, m in zip(preds, meas, strict=True))}
        row["chosen"] = {h: sum(1 for c, _ in chosen if c == h) for h, _ in chosen}
        row["chosen_loss"] = statistics.median(loss for _, loss in chosen)
        rows.append(row)
    return rows


def table(rows: list[dict], rungs: list[str], bound: float) -> str:
    head = "| class | docs | " + " | ".join(
        f"{r} predicted | {r} measured | {r} MAE (pp)" for r in rungs) + \
        " | ladder starts on | its measured loss | predict ms |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        cells = [f"{100 * row[r]['predicted']:.1f}% | {100 * row[r]['measured']:.1f}% | "
                 f"{row[r]['mae_pp']:.1f}" for r in rungs]
        chosen = ", ".join(f"{h} {n}" for h, n in sorted(row["chosen"].items()))
        lines.append(f"| {row['class']} | {row['docs']} | {' | '.join(cells)} | {chosen} | "
                     f"{100 * row['chosen_loss']:.1f}% | {row['predict_ms']} |")
    worst = max(row[r]["mae_pp"] for row in rows for r in rungs)
    verdict = "MET" if worst <= 2.0 else "MISSED"
    lines.append(f"\ntarget quality estimate median absolute error <= 2 pp per content class: "
                 f"{verdict} (worst {worst:.1f} pp); bound {bound:.0%}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--classes", default=",".join(("prose", "code", "docs", *languages())))
    ap.add_argument("--docs", type=int, default=8, help="documents per class")
    ap.add_argument("--chars", type=int, default=2000, help="characters per document "
                    "(the first half is the prompt)")
    ap.add_argument("--positions", type=int, default=64, help="as the engine's default")
    ap.add_argument("--bound", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--compute-dtype", default="float32", help="float32: exact losses; the "
                    "engine measures in its own dtype (bfloat16 where the CPU has it)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(args.model, compute_dtype=args.compute_dtype)
    ckpt = ckpt.with_readings(sorted(ckpt.manifest.readings.values()))
    rows = run(ckpt, [c for c in args.classes.split(",") if c], args.docs, args.chars,
               args.positions, args.bound)
    rungs = [k for k in rows[0] if k.endswith(("+groups", "+groups kl"))]
    print(table(rows, rungs, args.bound))  # noqa: T201 - the report
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
