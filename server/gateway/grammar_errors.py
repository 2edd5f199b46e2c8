"""A structured-output constraint the grammar library refuses, as a 400 in the request's
terms: the field the client filled in and what is wrong with it.

xgrammar's messages start with its log prefix, `[hh:mm:ss] /its/build/path/file.cc:NNN: `,
which means nothing to a client and leaks the library's build tree: it is cut from every
message, and the messages clients meet most are rephrased in JSON Schema's own words.
"""

from __future__ import annotations

import re

from heads.errors import GrammarError
from server.errors import BadRequest

# The library's log prefix: a timestamp, then a source file and line.
_LIBRARY_PREFIX = re.compile(r"\[\d{1,2}:\d{2}:\d{2}\]\s*\S+?:\d+:\s*")
# A debug build appends the C++ stack to the message: nothing a client can act on.
_STACK = re.compile(r"\s*Stack trace:.*", re.DOTALL)

_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'^Unsupported type "(.*)"$'), r'unsupported type "\1"'),
    (re.compile(r"^(?:Type should be a string|type must be a string or an array of strings)$"),
     '"type" must be a string or an array of strings'),
    (re.compile(r"^Cannot find field (\S+) in (\S+)$"), r'$ref "\2" does not resolve: no "\1"'),
    (re.compile(r"^Invalid range: minimum greater than maximum$"),
     "minimum is greater than maximum"),
)


def library_message(text: str) -> str:
    """The library's message without its log prefix or stack trace, first letter lowered
    (it follows a colon) unless the first word is an acronym such as EBNF."""
    text = _STACK.sub("", _LIBRARY_PREFIX.sub("", text)).strip()
    for pattern, phrase in _PHRASES:
        if pattern.match(text):
            return pattern.sub(phrase, text)
    if len(text) > 1 and text[0].isupper() and not text[1].isupper():
        text = text[0].lower() + text[1:]
    return text


def bad_structured_output(error: GrammarError, kind: str, field: str) -> BadRequest:
    """`kind`: the constraint's StructuredSpec kind, which the engine's GrammarError starts
    with; `field`: where the client gave it, e.g. `response_format.json_schema`. The 400's
    param is that field's top-level name."""
    text = str(error)
    if text.startswith(f"{kind}: "):
        text = text[len(kind) + 2:]
    return BadRequest(f"{field}: {library_message(text)}", param=field.split(".", 1)[0])
