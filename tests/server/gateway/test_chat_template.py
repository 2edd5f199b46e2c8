import pytest

from server.errors import BadRequest
from server.gateway.chat_template import (
    GEMMA,
    GEMMA_TEMPLATE,
    PLAIN,
    QA,
    QA_TEMPLATE,
    choose_chat_format,
    render_chat,
)

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


def test_plain_fallback_is_documented_format():
    assert render_chat(MSGS, None, "<s>", "</s>") == "<s>system: sys\nuser: hi\nassistant:"


def test_model_template_gets_bos_and_generation_prompt():
    tpl = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
           "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert render_chat(MSGS, tpl, "<bos>", "") == "<bos><system>sys<user>hi<assistant>"


def test_template_raise_exception_becomes_400():
    tpl = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(BadRequest, match="roles must alternate"):
        render_chat(MSGS, tpl, "", "")


def test_sandbox_blocks_attribute_escape():
    tpl = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(BadRequest):
        render_chat(MSGS, tpl, "", "")


# --- the chat format: which template, and what ends the assistant's turn -----------------

GEMMA_SPECIALS = {"<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>"}
CONVO = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hello"},
         {"role": "assistant", "content": "Hi!\n"}, {"role": "user", "content": "Bye"}]


def test_checkpoint_template_wins_and_stops_on_the_turn_tokens_it_uses():
    tpl = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"
    fmt = choose_chat_format(tpl, "llama", lambda t: t in {"<|im_end|>", "<end_of_turn>"})
    assert (fmt.name, fmt.template, fmt.stop_tokens, fmt.stop_strings) == (
        "model", tpl, ("<|im_end|>",), ())


def test_template_token_not_special_in_every_head_is_no_stop_token():
    tpl = "{{ messages[0].content }}<|im_end|>"
    assert choose_chat_format(tpl, "llama", lambda t: False).stop_tokens == ()


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_no_template_gives_the_question_answer_format(arch):
    assert choose_chat_format(None, arch, GEMMA_SPECIALS.__contains__) is QA
    assert choose_chat_format("", arch, GEMMA_SPECIALS.__contains__) is QA


def test_forced_formats():
    specials = GEMMA_SPECIALS.__contains__
    assert choose_chat_format("{{ x }}", "gemma3", specials, "gemma") is GEMMA
    assert choose_chat_format("{{ x }}", "gemma3", specials, "plain") is PLAIN
    assert choose_chat_format("{{ x }}", "gemma3", specials, "qa") is QA
    with pytest.raises(ValueError, match="Gemma backbone"):
        choose_chat_format(None, "llama", specials, "gemma")
    with pytest.raises(ValueError, match="Gemma backbone"):  # turn tokens split or missing
        choose_chat_format(None, "gemma3", {"<end_of_turn>"}.__contains__, "gemma")
    with pytest.raises(ValueError, match="no chat template"):
        choose_chat_format(None, "gemma3", specials, "model")
    with pytest.raises(ValueError, match="one of"):
        choose_chat_format(None, "gemma3", specials, "chatml")


def test_implicit_stops_of_each_format():
    assert (QA.stop_tokens, QA.stop_strings) == ((), ("\nQuestion:", "\nAnswer:"))
    assert (PLAIN.stop_tokens, PLAIN.stop_strings) == ((), ("\nuser:", "\nassistant:"))
    assert (GEMMA.stop_tokens, GEMMA.stop_strings) == (("<end_of_turn>", "<start_of_turn>"), ())


def test_gemma_rendering_folds_the_system_message_into_the_first_user_turn():
    assert render_chat(CONVO, GEMMA_TEMPLATE, "<bos>", "<eos>") == (
        "<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


def test_gemma_rendering_of_a_lone_system_message_and_of_unalternating_roles():
    assert render_chat(CONVO[:1], GEMMA_TEMPLATE, "<bos>", "") == (
        "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n")
    two = [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]
    assert render_chat(two, GEMMA_TEMPLATE, "", "") == (
        "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>user\nb<end_of_turn>\n"
        "<start_of_turn>model\n")


def test_question_answer_rendering():
    assert render_chat(CONVO, QA_TEMPLATE, "<bos>", "<eos>") == (
        "<bos>Be brief.\n\nQuestion: Hello\nAnswer: Hi!\nQuestion: Bye\nAnswer:")
    assert render_chat(CONVO[1:2], QA_TEMPLATE, "<bos>", "") == "<bos>Question: Hello\nAnswer:"
