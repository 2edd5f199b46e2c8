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

Only the head that served a request learns from it, so early on one head has a live figure
for a script and the others do not. Shrinking only that head would favour it for no reason
but having been tried; the others borrow its figure, scaled by how their own spelling of
this prompt compares (m_h ≈ m_g · p_h ÷ p_g: heads' relative compression is a property of
the text), with the evidence weight of the head they borrow from.
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


def _shrink(head: HeadProfile, features: RequestFeatures, live: float | None, n: int) -> float:
    prompt = features.prompt_bpt(head.name)
    if prompt is None:
        return live if live is not None else head.bpt
    if live is None:
        return prompt
    t = features.tokens[head.name].prompt_tokens
    k = min(n, LIVE_WEIGHT_CAP)
    return (t * prompt + k * live) / (t + k)


def predict_output_bpt(head: HeadProfile, features: RequestFeatures,
                       out_bytes: Mapping[str, int], out_tokens: Mapping[str, int]) -> float:
    """One head's prediction from its own live figure only."""
    return _shrink(head, features, *live_bpt(head.name, features.script, out_bytes, out_tokens))


def predict_all(profiles: Sequence[HeadProfile], features: RequestFeatures,
                out_bytes: Mapping[str, int], out_tokens: Mapping[str, int]) -> dict[str, float]:
    """Every head's prediction; heads without a live figure borrow the best-supported one's."""
    live = {p.name: live_bpt(p.name, features.script, out_bytes, out_tokens) for p in profiles}
    known = [h for h, (m, _) in live.items() if m is not None]
    donor = max(known, key=lambda h: live[h][1]) if known else None
    out = {}
    for p in profiles:
        m, n = live[p.name]
        if m is None and donor is not None:
            mine, theirs = features.prompt_bpt(p.name), features.prompt_bpt(donor)
            if mine is not None and theirs is not None:
                m, n = live[donor][0] * mine / theirs, live[donor][1]  # type: ignore[operator]
        out[p.name] = _shrink(p, features, m, n)
    return out
