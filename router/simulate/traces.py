"""Arrival traces: synthetic regimes (seeded, reproducible) and CSV/JSONL files.

A trace is a list of SimRequest sorted by arrival. Text sizes are in bytes, so every head
sees the same work; each head turns them into its own token counts.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival_s: float
    prompt_bytes: int
    output_bytes: int  # the text the model would write if max_tokens allowed it
    max_tokens: int
    lang: str = "en"  # language of the prompt and of the text the answer continues


# The multilingual trace's language mix, fixed before any result was seen: half English, the
# other half split evenly over nine languages covering Latin (de, fr, es, pl), Cyrillic (ru),
# CJK (ja, zh), Hangul (ko) and Devanagari (hi). It is not tuned to the router.
MULTILINGUAL_MIX: dict[str, float] = {"en": 0.5, **dict.fromkeys(
    ("de", "fr", "es", "pl", "ru", "ja", "zh", "ko", "hi"), 0.5 / 9)}


# The mixed trace's content mix, fixed before any result was seen, after what public API
# traffic studies report in broad strokes (programming and technical help as the largest
# share of requests, then writing in English, then other languages): English prose 35%,
# source code 25%, technical documentation 15%, and 25% split evenly over the 13 other
# committed languages. "code" and "docs" are content classes (heads.corpus.content).
MIXED_MIX: dict[str, float] = {"en": 0.35, "code": 0.25, "docs": 0.15, **dict.fromkeys(
    ("cs", "de", "es", "fr", "hi", "it", "ja", "ko", "pl", "pt-br", "ru", "uk", "zh"),
    0.25 / 13)}


def _sizes(rng: random.Random, prompt: float, output: float) -> tuple[int, int]:
    # Log-normal around the medians: a few long prompts and long answers, like chat traffic.
    return (max(16, int(rng.lognormvariate(math.log(prompt), 0.6))),
            max(8, int(rng.lognormvariate(math.log(output), 0.5))))


def poisson(rate: Callable[[float], float], duration_s: float, prompt: float, output: float,
            max_tokens: int, seed: int, peak: float) -> list[SimRequest]:
    """Non-homogeneous Poisson arrivals by thinning; `peak` bounds rate(t)."""
    rng, t = random.Random(seed), 0.0
    out: list[SimRequest] = []
    while True:
        t += rng.expovariate(peak)
        if t >= duration_s:
            return out
        if rng.random() * peak <= rate(t):
            p, o = _sizes(rng, prompt, output)
            out.append(SimRequest(t, p, o, max_tokens))


def edge(duration_s: float = 300, seed: int = 1) -> list[SimRequest]:
    """One user at a time: ~0.1 req/s, short prompts."""
    return poisson(lambda t: 0.1, duration_s, 600, 600, 512, seed, 0.1)


def datacenter(duration_s: float = 300, seed: int = 2) -> list[SimRequest]:
    """Busy serving: 30 req/s of chat requests (B in the tens to hundreds)."""
    return poisson(lambda t: 30.0, duration_s, 2000, 1200, 512, seed, 30.0)


def bursty(duration_s: float = 300, seed: int = 3) -> list[SimRequest]:
    """Quiet (0.2 req/s) with 20 s bursts of 80 req/s every 100 s."""
    return poisson(lambda t: 80.0 if t % 100 < 20 else 0.2, duration_s, 1500, 1000, 512,
                   seed, 80.0)


def diurnal(duration_s: float = 600, seed: int = 4) -> list[SimRequest]:
    """A day compressed into `duration_s`: night ~0.1 req/s, midday peak 60 req/s."""
    def rate(t: float) -> float:
        day = 0.5 - 0.5 * math.cos(2 * math.pi * t / duration_s)  # 0 at night, 1 at noon
        return 0.1 + 60.0 * day ** 3
    return poisson(rate, duration_s, 1500, 1000, 512, seed, 60.1)


@dataclass(frozen=True, slots=True)
class Phase:
    regime: str  # "low" (B≈1) or "high" (many requests in flight)
    end_s: float  # the phase runs until this trace time
    rate: float  # arrivals per second


def day_phases(duration_s: float, quiet: float = 0.15, peak: float = 2.0) -> tuple[Phase, ...]:
    """A day compressed for a real engine on a CPU: night, a busy noon, night again."""
    return (Phase("low", 0.3 * duration_s, quiet), Phase("high", 0.7 * duration_s, peak),
            Phase("low", duration_s, quiet))


def phase_at(phases: tuple[Phase, ...], t: float) -> Phase:
    return next((p for p in phases if t < p.end_s), phases[-1])


def cpu_day(duration_s: float = 150, seed: int = 5, peak: float = 2.0) -> list[SimRequest]:
    """`day_phases` with short chat turns (~60 prompt, ~50 output tokens): a real CPU engine
    replays it in a few minutes, at B≈1 at night and many requests in flight at noon."""
    phases = day_phases(duration_s, peak=peak)
    return poisson(lambda t: phase_at(phases, t).rate, duration_s, 240, 200, 96, seed,
                   max(p.rate for p in phases))


def with_languages(trace: list[SimRequest], mix: dict[str, float],
                   seed: int) -> list[SimRequest]:
    """The same arrivals and sizes, each request drawn a language from `mix` (own RNG, so
    every mix keeps the arrivals)."""
    rng = random.Random(seed)
    langs, weights = list(mix), list(mix.values())
    return [SimRequest(r.arrival_s, r.prompt_bytes, r.output_bytes, r.max_tokens,
                       rng.choices(langs, weights)[0]) for r in trace]


def multilingual(duration_s: float = 150, seed: int = 5, peak: float = 2.0) -> list[SimRequest]:
    """`cpu_day` arrivals with MULTILINGUAL_MIX languages; max_tokens leaves room for the
    ~1 byte/token a head without the script needs."""
    base = [SimRequest(r.arrival_s, r.prompt_bytes, r.output_bytes, 320)
            for r in cpu_day(duration_s, seed, peak)]
    return with_languages(base, MULTILINGUAL_MIX, seed + 1)


def english(duration_s: float = 150, seed: int = 5, peak: float = 2.0) -> list[SimRequest]:
    """The multilingual trace's arrivals and sizes, every request in English."""
    return with_languages(multilingual(duration_s, seed, peak), {"en": 1.0}, seed + 1)


def mixed(duration_s: float = 150, seed: int = 5, peak: float = 2.0) -> list[SimRequest]:
    """The multilingual trace's arrivals and sizes with MIXED_MIX content: prose, code,
    documentation and languages."""
    return with_languages(multilingual(duration_s, seed, peak), MIXED_MIX, seed + 2)


TRACES: dict[str, Callable[..., list[SimRequest]]] = {
    "edge": edge, "datacenter": datacenter, "bursty": bursty, "diurnal": diurnal,
    "cpu-day": cpu_day, "multilingual": multilingual, "english": english, "mixed": mixed,
}
TEXT_TRACES = ("multilingual", "english", "mixed")  # their requests carry content classes


def load_trace(path: Path) -> list[SimRequest]:
    """CSV with a header, or JSON lines; fields arrival_s, prompt_bytes, output_bytes,
    max_tokens (default 512), lang (default en)."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = list(csv.DictReader(text.splitlines()))
    out = [SimRequest(float(r["arrival_s"]), int(r["prompt_bytes"]), int(r["output_bytes"]),
                      int(r.get("max_tokens") or 512), str(r.get("lang") or "en"))
           for r in rows]
    return sorted(out, key=lambda r: r.arrival_s)
