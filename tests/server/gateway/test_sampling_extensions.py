"""vLLM's sampling extensions as the planner reads them: which are served, the rules they
become, and the 400 for each one that is not served unless neutral."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 1.1), ("presence_penalty", 0.5), ("frequency_penalty", -0.5),
    ("min_p", 0.05), ("logit_bias", {"5": 1.0}), ("allowed_token_ids", [1, 2]),
    ("bad_words", ["no"]),
])
def test_logit_shaping_fields_are_refused_by_name(field, value):
    with pytest.raises(BadRequest) as e:
        extensions(completion(**{field: value}))
    assert e.value.param == field


def test_min_tokens_only_where_nothing_can_stop_early():
    assert extensions(completion(min_tokens=4, ignore_eos=True, max_tokens=8)).ignore_eos
    for fields in ({"min_tokens": 4}, {"min_tokens": 4, "ignore_eos": True, "stop": "x"},
                   {"min_tokens": 4, "ignore_eos": True, "stop_token_ids": [3]},
                   {"min_tokens": 9, "ignore_eos": True, "max_tokens": 8}):
        with pytest.raises(BadRequest) as e:
            extensions(completion(**fields))
        assert e.value.param == "min_tokens"


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
