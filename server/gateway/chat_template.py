"""Render chat messages to a prompt string, and know what ends the assistant's turn.

The template is the checkpoint's own (tokenizer config or GGUF metadata, copied into the
manifest) when it has one: instruction-tuned checkpoints ship theirs. A checkpoint without
one is in practice a base model (the demo's GGUF is the base Gemma-3-270M), and gets the
question/answer format, QA_TEMPLATE:
    <bos>system text\\n\\nQuestion: ...\\nAnswer: ...\\nQuestion: ...\\nAnswer:
a layout common in web text, so in a base model's pre-training. Measured on the demo with
`polyhead bench chat` (20 prompts, greedy), it beats the alternatives that can be forced
with the chat_format setting:
- "gemma": Gemma's turn format. The base checkpoint never trained its
  `<start_of_turn>`/`<end_of_turn>` rows (they sit among the `<unused*>` rows, cosine 0.95 to
  their centroid), so it reads them as noise; only for Gemma checkpoints tuned on them;
- "plain": PLAIN_TEMPLATE, `<bos>system: ...\\nuser: ...\\nassistant:`, which the base
  model answers by echoing the prompt as a new turn.

A base model does not stop at the end of its turn by itself: it writes the next turn. So
each format names its implicit stops, added to every chat request and never returned in
the text: end-of-turn special tokens (stop token ids) and the next turn's marker (stop
strings).

Templates run in jinja2's immutable sandbox, as transformers does, because a template is
data shipped with a model, not trusted code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from heads.vocab.tokenizer import HeadTokenizer
from server.errors import BadRequest

PLAIN_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

QA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{%- if m['role'] in ('system', 'developer') -%}{{ (m['content'] | trim) + '\n\n' }}"
    "{%- elif m['role'] == 'assistant' -%}{{ 'Answer: ' + (m['content'] | trim) + '\n' }}"
    "{%- else -%}{{ 'Question: ' + (m['content'] | trim) + '\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Answer:' }}{%- endif -%}"
)

# Gemma's turn format, as in its instruction-tuned checkpoints' template: a leading system
# (or developer) message is folded into the first turn, assistant turns are "model", and
# content is trimmed. Unlike that template it does not reject a conversation whose roles do
# not alternate: every other role is rendered as a user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for m in messages -%}"
    "{%- if loop.first and m['role'] in ('system', 'developer') -%}"
    "{%- set ns.prefix = (m['content'] | trim) + '\n\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' }}"
    "{{ ns.prefix + (m['content'] | trim) + '<end_of_turn>\n' }}"
    "{%- set ns.prefix = '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if ns.prefix -%}{{ '<start_of_turn>user\n' + (ns.prefix | trim) + '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

# Special tokens that end a turn in the templates we know of; a checkpoint's own template
# stops on those it uses.
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>")


@dataclass(frozen=True, slots=True)
class ChatFormat:
    name: str  # "model" (the checkpoint's template) | "qa" | "gemma" | "plain"
    template: str  # jinja2 source
    # Special-token texts whose ids end the assistant's turn: stop token ids on chat requests.
    # "<start_of_turn>" is one: a model that opens a new turn has ended its own.
    stop_tokens: tuple[str, ...]
    stop_strings: tuple[str, ...]  # text that starts the next turn, cut from the reply


QA = ChatFormat("qa", QA_TEMPLATE, (), ("\nQuestion:", "\nAnswer:"))
PLAIN = ChatFormat("plain", PLAIN_TEMPLATE, (), ("\nuser:", "\nassistant:"))
GEMMA = ChatFormat("gemma", GEMMA_TEMPLATE, ("<end_of_turn>", "<start_of_turn>"), ())
# Backbone architectures whose family turn format "gemma" may be forced on.
GEMMA_ARCHITECTURES = frozenset({"gemma3"})
FORMAT_NAMES = ("auto", "model", "qa", "gemma", "plain")


def choose_chat_format(template: str | None, architecture: str,
                       is_special: Callable[[str], bool], choice: str = "auto") -> ChatFormat:
    """`is_special(text)`: whether `text` is one special token in every head's vocabulary.
    `choice` forces a format; "auto" is the checkpoint's template, else "qa"."""
    if choice not in FORMAT_NAMES:
        raise ValueError(f"chat format must be one of {FORMAT_NAMES}, not {choice!r}")
    if choice in ("auto", "model") and template:
        return ChatFormat("model", template,
                          tuple(t for t in END_OF_TURN_TOKENS if t in template and is_special(t)),
                          ())
    if choice == "model":
        raise ValueError("chat format 'model': the checkpoint carries no chat template")
    if choice == "gemma":
        if architecture not in GEMMA_ARCHITECTURES or not all(
                is_special(t) for t in GEMMA.stop_tokens):
            raise ValueError(f"chat format 'gemma' needs a Gemma backbone with its turn tokens, "
                             f"not {architecture!r}")
        return GEMMA
    return PLAIN if choice == "plain" else QA


def special_on_every_head(tokenizers: Mapping[str, HeadTokenizer], text: str) -> bool:
    """Whether `text` is one token on every head, also inside rendered text: a stop token
    the tokenizer splits would never be sampled as one id."""
    for tok in tokenizers.values():
        tid = tok.token_to_id(text)
        if tid is None or tok.encode_with_specials(f"a{text}\n") != [
                *tok.encode_with_specials("a"), tid, *tok.encode_with_specials("\n")]:
            return False
    return True


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
