"""The agent example's real tools and its tool-call parser (examples/)."""

from __future__ import annotations

import pytest

from examples.agent_loop import parse_call
from examples.agent_tools import ToolError, calculator, search_docs


@pytest.mark.parametrize(("expr", "want"), [
    ("17 * 23 + 4", "395"), ("3 * (4 + 5)", "27"), ("7 / 2", "3.5"), ("-2 ** 3", "-8"),
    ("10 // 3 + 10 % 3", "4"),
])
def test_calculator_evaluates_arithmetic(expr, want):
    assert calculator(expr) == want


@pytest.mark.parametrize("expr", [
    "__import__('os')", "a + 1", "2 ** 1000", "1 / 0", "1 +",
    # Out of a float's range, or not real: refused as the tool's error, not a crash.
    "(-8) ** 0.5", "(2 ** 64) ** 64", "1e200 ** 2", "1e308 * 10", "((9 ** 64) ** 64) ** 64",
])
def test_calculator_refuses_anything_else(expr):
    with pytest.raises(ToolError):
        calculator(expr)


def test_search_returns_the_line_with_most_query_words(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("nothing here\nthe host pool keeps warm pages\npool only\n")
    hit = search_docs("warm host pool", files=[doc])
    assert (hit.path, hit.line, hit.score) == (str(doc), 2, 3)
    assert hit.text == "the host pool keeps warm pages"
    assert search_docs("zebra", files=[doc]) is None


@pytest.mark.parametrize(("line", "want"), [
    ("CALL calculator: 1 + 2", ("calculator", "1 + 2")),
    ("CALL search: KV connector: vLLM", ("search", "KV connector: vLLM")),
    ("ANSWER: 27", None), ("CALL shell: rm -rf /", None), ("CALL search:", None),
])
def test_parse_call(line, want):
    assert parse_call(line) == want
