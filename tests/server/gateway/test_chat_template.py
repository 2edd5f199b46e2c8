import pytest

from server.errors import BadRequest
from server.gateway.chat_template import render_chat

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
