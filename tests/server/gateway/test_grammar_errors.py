"""The grammar library's refusals, cut to what a client can act on: no timestamp, build path
or file:line, the common ones in JSON Schema's words, and the field the client filled in."""

from __future__ import annotations

import pytest

from heads.errors import GrammarError
from server.gateway.grammar_errors import bad_structured_output, library_message


@pytest.mark.parametrize(("raw", "said"), [
    ('[01:13:14] /project/cpp/json_schema_converter.cc:4944: Unsupported type "nonsense"\n',
     'unsupported type "nonsense"'),
    ("[03:36:03] /project/cpp/json_schema_converter.cc:4944: Type should be a string\n",
     '"type" must be a string or an array of strings'),
    ("[03:36:03] /project/cpp/json_schema_converter.cc:4950: Cannot find field defs in #/x\n",
     '$ref "#/x" does not resolve: no "defs"'),
    ("[03:36:03] /a/b.cc:1: enum array must not be empty\nStack trace:\n  [bt] (0) x.so\n",
     "enum array must not be empty"),
    ("[03:36:03] /project/cpp/grammar_parser.cc:820: EBNF parser error at line 1, column 10: "
     'Rule "foo" is not defined\n', 'EBNF parser error at line 1, column 10: Rule "foo" is '
     "not defined"),
    ("a message of no known shape", "a message of no known shape"),
])
def test_library_message(raw, said):
    assert library_message(raw) == said


def test_the_400_names_the_field_and_its_top_level_param():
    e = GrammarError('json_schema: [01:13:14] /project/cpp/json_schema_converter.cc:4944: '
                     'Unsupported type "nonsense"')
    err = bad_structured_output(e, "json_schema", "response_format.json_schema")
    assert err.message == 'response_format.json_schema: unsupported type "nonsense"'
    assert err.param == "response_format"
