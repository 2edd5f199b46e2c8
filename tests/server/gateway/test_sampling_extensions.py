"""vLLM's sampling extensions as the planner reads them: the rules they become, and the 400
for each malformed one."""

from __future__ import annotations

import pytest

from heads.engine.types import LogitRules
from heads.model.weights import load_checkpoint
from server.errors import BadRequest
from server.gateway.sampling_extensions import Extensions, check_ids_on_head, extensions
from server.gateway.stop_strings import StopStringMatcher
from server.schemas import ChatCompletionRequest, CompletionRequest

BOS = 2


def completion(**fields) -> CompletionRequest:
    return CompletionRequest(model="m", prompt="x", **fields)


def test_neutral_values_are_served():
    ext = extensions(completion(repetition_penalty=1.0, presence_penalty=0, min_p=0.0,
                                frequency_penalty=0.0, logit_bias={}, bad_words=[],
                                min_tokens=0, spaces_between_special_tokens=True))
    assert ext == Extensions(add_special_tokens=True)


def test_logit_shaping_fields_become_logit_rules():
    ext = extensions(completion(repetition_penalty=1.1, presence_penalty=0.5,
                                frequency_penalty=-0.5, min_p=0.05, min_tokens=3,
                                logit_bias={"5": 1.0, "9": -250}, allowed_token_ids=[1, 2, 40],
                                bad_words=["no", "no", "way"]))
    assert ext.rules == LogitRules(1.1, 0.5, -0.5, 0.05, 3, ((5, 1.0), (9, -100.0)),
                                   frozenset({1, 2, 40}))
    assert ext.rules.shapes and not Extensions().rules.shapes
    assert ext.bad_words == ("no", "way")  # repeats dropped, spelled per head later
    assert ext.min_vocab == 41  # the largest id any field names, plus one


@pytest.mark.parametrize("fields,param", [
    ({"logit_bias": {"a": 1.0}}, "logit_bias"), ({"logit_bias": {"-1": 1.0}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"), ({"bad_words": ["  "]}, "bad_words"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
])
def test_malformed_rules_are_refused_by_name(fields, param):
    with pytest.raises(BadRequest) as e:
        extensions(completion(**fields))
    assert e.value.param == param


def test_bad_words_are_spelled_on_each_head(tiny_model_dir):
    ckpt = load_checkpoint(tiny_model_dir, compute_dtype="float32")
    ext = extensions(completion(bad_words=["the quick", "fox"]))
    for head, tok in ckpt.tokenizers.items():
        words = ext.rules_on(tok).bad_words_ids
        assert tuple(tok.encode("the quick")) in words and tuple(tok.encode("fox")) in words
        spaced = tuple(tok.encode(" fox"))
        bare = tuple(tok.encode("fox"))
        assert (spaced in words) == (spaced[0] != bare[0] and len(spaced) == len(bare)), head
        assert all(t < tok.vocab_size for w in words for t in w)


def test_stop_ids_with_and_without_eos():
    ext = extensions(completion(stop_token_ids=[7, 9]))
    assert ext.stop_ids([1]) == {1, 7, 9}
    assert extensions(completion(stop_token_ids=[7], ignore_eos=True)).stop_ids([1]) == {7}
    assert ext.min_vocab == 10
    assert Extensions().min_vocab == 0


def test_pinned_head_must_hold_the_stop_ids():
    ext = extensions(completion(stop_token_ids=[1000]))
    check_ids_on_head(ext, "8k", 8192)
    with pytest.raises(BadRequest) as e:
        check_ids_on_head(ext, "1k", 1000)
    assert e.value.param == "stop_token_ids" and "1000" in e.value.message


def test_prompt_ids_bos_and_truncation():
    ids = (BOS, 10, 11, 12, 13)
    assert Extensions(add_special_tokens=True).prompt_ids(ids, BOS, 100) == ids
    assert Extensions(add_special_tokens=False).prompt_ids(ids, BOS, 100) == ids[1:]
    assert Extensions(add_special_tokens=True).prompt_ids(ids[1:], BOS, 100) == ids
    # Chat leaves the template's one BOS alone whatever the field says.
    assert Extensions(add_special_tokens=None).prompt_ids(ids, BOS, 100) == ids
    assert Extensions(truncate_prompt_tokens=2).prompt_ids(ids, BOS, 100) == (12, 13)
    assert Extensions(truncate_prompt_tokens=-1).prompt_ids(ids, BOS, 3) == (11, 12, 13)
    assert Extensions(truncate_prompt_tokens=50).prompt_ids(ids, BOS, 100) == ids
    with pytest.raises(BadRequest):
        extensions(completion(truncate_prompt_tokens=0))


def test_chat_extensions_validate_the_open_turn():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    body = ChatCompletionRequest(model="m", messages=msgs, add_generation_prompt=False,
                                 continue_final_message=True)
    assert extensions(body).add_special_tokens is None
    with pytest.raises(ValueError, match="add_generation_prompt"):
        ChatCompletionRequest(model="m", messages=msgs, continue_final_message=True)
    with pytest.raises(ValueError, match="final assistant message"):
        ChatCompletionRequest(model="m", messages=msgs[:1], add_generation_prompt=False,
                              continue_final_message=True)


def test_include_stop_str_keeps_the_matched_stop():
    m = StopStringMatcher(["END"], include_stop=True)
    assert m.feed("abc E") + m.feed("ND tail") == "abc END"
    m = StopStringMatcher(["END"])
    assert m.feed("abc E") + m.feed("ND tail") == "abc "


def test_every_logit_rule_needs_every_logit_bad_words_included():
    # bad_words are spelled on the chosen head only after routing, so they are not in the
    # rules yet: the router must still keep such a request off a two-level reading.
    assert not Extensions().needs_logits
    assert Extensions(bad_words=("the",)).needs_logits
    assert Extensions(rules=LogitRules(min_p=0.1)).needs_logits


@pytest.mark.parametrize(("fields", "where"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
    ({"guided_choice": ["a", "b"]}, "guided_choice"),
    ({}, ""),
])
def test_the_structured_field_is_where_the_request_gave_it(fields, where):
    ext = extensions(completion(**fields))
    assert ext.structured_field == where
    assert (ext.structured is None) == (where == "")
