"""Render chat messages to a prompt string with the model's own jinja2 template.

Templates come from the checkpoint (tokenizer config or GGUF metadata, copied into the
manifest). They run in jinja2's immutable sandbox, as transformers does, because a template
is data shipped with a model, not trusted code.

PLAIN_TEMPLATE is the documented fallback for models without a template:
    <bos>system: ...\\nuser: ...\\nassistant: ...\\nassistant:
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from server.errors import BadRequest

PLAIN_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _raise_exception(message: str) -> None:
    # Templates call raise_exception() to reject unsupported conversations (e.g. bad roles).
    raise BadRequest(f"chat template rejected the conversation: {message}", param="messages")


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(source)


def render_chat(
    messages: list[dict[str, Any]],
    template: str | None,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """`continue_final_message`: the last (assistant) message stays open, cut right after its
    content as transformers does, so the reply continues it. `template_kwargs` are extra
    template variables (vLLM's chat_template_kwargs); they cannot replace the ones above."""
    try:
        compiled = _compile(template or PLAIN_TEMPLATE)
        text = str(
            compiled.render(
                **(template_kwargs or {}),
                messages=messages,
                bos_token=bos_token,
                eos_token=eos_token,
                add_generation_prompt=add_generation_prompt,
            )
        )
    except TemplateError as e:
        raise BadRequest(f"chat template failed: {e}", param="messages") from e
    if continue_final_message:
        final = str(messages[-1].get("content") or "").strip()
        end = text.rfind(final) if final else -1
        if end < 0:
            raise BadRequest("continue_final_message: the template did not render the final "
                             "message's content", param="messages")
        text = text[:end + len(final)]
    return text


RESERVED_TEMPLATE_VARS = frozenset({"messages", "bos_token", "eos_token",
                                    "add_generation_prompt"})
