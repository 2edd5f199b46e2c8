"""vLLM's logit-shaping extensions: the row rules against vLLM's own sampler functions as the
oracle, and greedy decoding on the tiny model's engine against a decode-from-scratch
reference that shapes every step's full logits the same way."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from heads.engine.logit_rules import apply_min_p, shape_logits
from heads.engine.types import GenerationRequest, LogitRules
from heads.model.forward import forward_logits
from heads.model.weights import Checkpoint, load_checkpoint
from kernels.row_params import RowParams
from tests.heads.engine.run_util import run_requests

V = 1000  # an odd width: not a multiple of any block size


def _row(seed: int = 0) -> torch.Tensor:
    return torch.randn(1, V, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.vllm
@pytest.mark.parametrize("rep,freq,pres", [(1.3, 0.0, 0.0), (0.7, 0.5, -0.4), (1.0, 1.5, 2.0)])
def test_penalties_match_vllms_apply_penalties(rep, freq, pres):
    from vllm.model_executor.layers.utils import apply_penalties

    prompt, output = [3, 7, 7, 999, 12], [7, 40, 40, 40, 5, 998]
    ours = _row()
    shape_logits(ours, LogitRules(rep, pres, freq), prompt, output, frozenset())
    theirs = apply_penalties(_row(), torch.tensor([prompt]), torch.tensor([output]),
                             torch.tensor([pres]), torch.tensor([freq]), torch.tensor([rep]))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.vllm
def test_bad_words_match_vllms_bad_words():
    from vllm.v1.sample.ops.bad_words import apply_bad_words

    words = ((5,), (7, 40), (40, 41, 42), (1, 2, 3, 4, 5, 6, 7, 8, 9))  # the last: too long
    for output in ([], [7], [3, 7], [40, 41], [7, 40, 41]):
        ours = _row()
        shape_logits(ours, LogitRules(bad_words_ids=words), [1], output, frozenset())
        theirs = _row()
        apply_bad_words(theirs, {0: [list(w) for w in words]}, [list(output)])
        assert torch.equal(ours, theirs), output


@pytest.mark.vllm
@pytest.mark.parametrize("min_p,temperature", [(0.05, 1.0), (0.3, 6.0), (0.01, 2.0)])
def test_min_p_keeps_what_vllm_keeps(min_p, temperature):
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    ours = _row(1)
    apply_min_p(ours, min_p, temperature)
    # vLLM's own processor, given its state directly (its constructor wants a VllmConfig).
    proc = object.__new__(MinPLogitsProcessor)
    proc.min_p_count, proc.min_p = 1, torch.tensor([[min_p]])
    theirs = proc.apply(_row(1) / temperature)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    assert 1 < int(torch.isfinite(ours).sum()) < V  # the cut kept some and dropped some


def test_allowed_ids_bias_and_min_tokens():
    rules = LogitRules(min_tokens=3, logit_bias=((4, 2.5), (9, -100.0)),
                       allowed_token_ids=frozenset({1, 4, 9, 17, 5000}))
    base = _row()
    row = base.clone()
    shape_logits(row, rules, [1, 2], [8], frozenset({17}))
    finite = torch.isfinite(row[0]).nonzero().flatten().tolist()
    assert finite == [1, 4, 9]  # 17 is a stop id masked before the third token; 5000 > V
    assert math.isclose(float(row[0, 4]), float(base[0, 4]) + 2.5, abs_tol=1e-6)
    row = base.clone()
    shape_logits(row, rules, [1, 2], [8, 8, 8], frozenset({17}))
    assert bool(torch.isfinite(row[0, 17]))  # min_tokens met: the stop id is back


def test_min_p_is_ignored_by_greedy_rows():
    row = _row()
    apply_min_p(row, 0.9, 0.0)
    assert bool(torch.isfinite(row).all())


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir: Path) -> Checkpoint:
    return load_checkpoint(tiny_model_dir, compute_dtype="float32")


def _reference_greedy(ckpt: Checkpoint, head: str, prompt: list[int], n: int,
                      rules: LogitRules, stops: frozenset[int]) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        logits = forward_logits(ckpt, head, prompt + out)[-1:].float()  # [1, V]
        shape_logits(logits, rules, prompt, out, stops)
        out.append(int(torch.argmax(logits)))
        if out[-1] in stops:
            break
    return out


@pytest.mark.parametrize("head", ["1k", "4k", "8k"])
def test_engine_greedy_with_rules_matches_the_shaped_reference(ckpt, head):
    """Shaped and unshaped requests share steps: the shaped rows take the materialised path,
    the others the kernels, and each is what its reference decodes."""
    prompt, stops = [2, 17, 301, 17, 44, 9], frozenset({1})
    plain = _reference_greedy(ckpt, head, prompt, 8, LogitRules(), stops)
    rulesets = [LogitRules(repetition_penalty=1.8),
                LogitRules(frequency_penalty=1.2, presence_penalty=0.5),
                LogitRules(logit_bias=((plain[0], -100.0), (44, 5.0)),
                           allowed_token_ids=frozenset(range(30, 90)) | {plain[0]}),
                LogitRules(bad_words_ids=((plain[0],), (plain[1], plain[2])), min_tokens=6)]
    reqs = [GenerationRequest(f"r{i}", head, tuple(prompt), 8, RowParams(temperature=0.0),
                              stops, rules=r) for i, r in enumerate(rulesets)]
    unshaped = GenerationRequest("plain", head, tuple(prompt), 8, RowParams(temperature=0.0),
                                 stops)
    events = run_requests(ckpt.model, unshaped, *reqs)
    got = [[e.token_id for e in ev] for ev in events]
    assert got[0] == plain
    for rules, ids in zip(rulesets, got[1:], strict=True):
        assert ids == _reference_greedy(ckpt, head, prompt, 8, rules, stops), rules
    assert got[3][0] != plain[0] and got[4][0] != plain[0]  # bias and bad words bit
    assert set(got[3]) <= set(range(30, 90))


def test_seeded_sampling_with_allowed_ids_stays_inside_them(ckpt):
    allowed = frozenset({5, 6, 7, 300})
    reqs = [GenerationRequest(f"s{i}", "8k", (2, 3, 4), 12, RowParams(temperature=1.5, seed=i),
                              frozenset(), want_logprobs=True,
                              rules=LogitRules(allowed_token_ids=allowed, min_p=0.001))
            for i in range(4)]
    for events in run_requests(ckpt.model, *reqs):
        assert {e.token_id for e in events} <= allowed
        # Raw logprobs, as vLLM reports by default: under the head's whole softmax.
        assert all(e.logprob is not None and e.logprob < 0 for e in events)


def test_few_id_rules_skip_the_row_and_whole_row_rules_keep_it():
    from types import SimpleNamespace

    from heads.engine.row_sampler import needs_row

    def seq(rules: LogitRules, logprobs: bool = False) -> SimpleNamespace:
        return SimpleNamespace(constraint=None, rules=rules, want_logprobs=logprobs)

    few = LogitRules(min_tokens=4, logit_bias=((3, 1.0),), bad_words_ids=((5,), (6, 7)))
    assert not needs_row(seq(few))  # a per-row bias in the kernels
    assert needs_row(seq(few, logprobs=True))  # logprobs are reported raw, before the bias
    for whole in (LogitRules(repetition_penalty=1.2), LogitRules(min_p=0.1),
                  LogitRules(allowed_token_ids=frozenset({1}))):
        assert needs_row(seq(whole))


@pytest.mark.parametrize("impl", ["chunked", "split"])
def test_few_id_rules_as_a_row_bias_sample_what_the_shaped_row_samples(impl):
    """Seeded rows with bad words, min_tokens and logit_bias: the kernels with the per-row
    bias pick the token the reference samples from the shaped, materialised row."""
    from heads.engine.logit_rules import few_id_changes, row_biases
    from kernels import chunked, reference, split
    from kernels.sampling_params import SamplingBatch

    g = torch.Generator().manual_seed(7)
    w, h = torch.randn(V, 32, generator=g), torch.randn(6, 32, generator=g) * 2
    rules = [LogitRules(min_tokens=3), LogitRules(logit_bias=((11, 8.0), (500, -3.0))),
             LogitRules(bad_words_ids=((42,), (3, 9))), LogitRules(),
             LogitRules(min_tokens=9, logit_bias=((1, 50.0),)), LogitRules(logit_bias=((0, 4.0),))]
    outputs, stops = [[3], [3], [3], [], [3, 4], []], frozenset({1, 2})
    params = [RowParams(temperature=t, seed=s, top_k=k)
              for t, s, k in [(0.0, 0, 0), (0.9, 1, 0), (1.2, 2, 50), (0.0, 3, 0), (1.0, 4, 0),
                              (0.7, 5, 0)]]
    batch = SamplingBatch.from_rows(params, [9] * 6)
    changes = [few_id_changes(r, out, stops, V) for r, out in zip(rules, outputs, strict=True)]
    bias = row_biases(changes, None, torch.device("cpu"))
    assert bias is not None and bias.shape == (6, 501)  # up to the highest changed id
    fn = chunked.unembed_and_sample if impl == "chunked" else split.unembed_and_sample
    got = fn(h, w, batch, bias).token_ids.tolist()
    for i, (r, out) in enumerate(zip(rules, outputs, strict=True)):
        row = reference.compute_logits(h[i:i + 1], w)
        shape_logits(row, r, [], out, stops)
        one = SamplingBatch.from_rows([params[i]], [9])
        assert got[i] == int(reference.sample_from_logits(row, one).token_ids[0]), i
    assert got[4] != 1  # min_tokens bans the stop id its +50 bias would otherwise pick


def test_engine_few_id_rules_match_the_row_path_token_for_token(ckpt):
    """The same seeded requests with min_tokens, logit_bias and bad words: without logprobs
    they run through the kernels' per-row bias, with logprobs through the row path."""
    rules = LogitRules(min_tokens=10, logit_bias=((44, 3.0), (17, -2.0)), bad_words_ids=((9,),))
    def reqs(logprobs: bool) -> list[GenerationRequest]:
        return [GenerationRequest(f"{logprobs}{i}", head, (2, 17, 301, 44), 10,
                                  RowParams(temperature=0.9, seed=i), frozenset({1}),
                                  want_logprobs=logprobs, rules=rules)
                for i, head in enumerate(["1k", "4k", "8k", "8k"])]
    fast = [[e.token_id for e in ev] for ev in run_requests(ckpt.model, *reqs(False))]
    slow = [[e.token_id for e in ev] for ev in run_requests(ckpt.model, *reqs(True))]
    assert fast == slow
    assert all(len(ids) == 10 and 1 not in ids and 9 not in ids for ids in fast)
