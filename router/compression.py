"""Output bytes/token per request and head, predicted before the request runs.

Compression is a property of the text, not only of the head: the same head packs English at
~4.4 bytes/token and Russian at ~1.0. So each request gets its own prediction per head h:

    pred_h = (T_h · p_h + K_hs · m_hs) / (T_h + K_hs)

- p_h: the prompt's own bytes/token on h (T_h = its prompt tokens on h: this request's
  evidence, which grows with the prompt);
- m_hs: output bytes/token that finished requests of the same script class s showed on h,
  from cumulative counters (`LiveState.add_output`, persisted and shared with λ's);
- K_hs = min(output tokens behind m_hs, LIVE_WEIGHT_CAP): the live figure counts as that many
  tokens of evidence, so it never drowns a long prompt.

Without live data the prompt decides; without a tokenized prompt the live figure does; with
neither, the manifest's bytes/token (English prose) is all there is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from router.profiles import HeadProfile, RequestFeatures

log = logging.getLogger(__name__)

LIVE_WEIGHT_CAP = 512  # tokens of evidence the live per-script figure can weigh at most
SEP = "/"  # counter keys are "head/script"


def stat_key(head: str, script: str) -> str:
    return f"{head}{SEP}{script}"


def split_key(key: str) -> tuple[str, str]:
    head, _, script = key.partition(SEP)
    return head, script


def live_bpt(head: str, script: str, out_bytes: Mapping[str, int],
             out_tokens: Mapping[str, int]) -> tuple[float | None, int]:
    """(output bytes/token of finished requests of `script` on `head`, tokens behind it)."""
    key = stat_key(head, script)
    tokens = int(out_tokens.get(key, 0))
    if tokens <= 0:
        return None, 0
    return out_bytes.get(key, 0) / tokens, tokens


def predict_output_bpt(head: HeadProfile, features: RequestFeatures,
                       out_bytes: Mapping[str, int], out_tokens: Mapping[str, int]) -> float:
    live, n = live_bpt(head.name, features.script, out_bytes, out_tokens)
    prompt = features.prompt_bpt(head.name)
    if prompt is None:
        return live if live is not None else head.bpt
    if live is None:
        return prompt
    t = features.tokens[head.name].prompt_tokens
    k = min(n, LIVE_WEIGHT_CAP)
    return (t * prompt + k * live) / (t + k)


def predict_all(profiles: Sequence[HeadProfile], features: RequestFeatures,
                out_bytes: Mapping[str, int], out_tokens: Mapping[str, int]) -> dict[str, float]:
    return {p.name: predict_output_bpt(p, features, out_bytes, out_tokens) for p in profiles}
