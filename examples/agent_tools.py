"""The agent example's real local tools: a calculator and a search over the repo's docs."""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_MAX_BITS = 1000  # integers a float still holds (about 1.8e308 is its largest)


class ToolError(ValueError):
    """The tool could not run on this input (the observation says so)."""


def calculator(expression: str) -> str:
    """Evaluate + - * / // % ** and parentheses over numbers; nothing else is allowed."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return _real(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ToolError("exponent too large")
            return _real(_OPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _real(_OPS[type(node.op)](ev(node.operand)))
        raise ToolError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        value = ev(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise ToolError(str(exc)) from exc
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _real(value: object) -> float:
    """``value`` if it is a finite real number a float can hold, else `ToolError` (every
    intermediate result is checked, so no step works on a huge integer)."""
    if not isinstance(value, int | float):  # a negative number to a fractional power
        raise ToolError(f"not a real number: {value}")
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise ToolError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result out of range")
    return value


@dataclass(frozen=True, kw_only=True)
class SearchHit:
    path: str
    line: int
    text: str
    score: int


def doc_files() -> list[Path]:
    files = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
    return [p for p in files if p.is_file()]


def search_docs(query: str, files: list[Path] | None = None) -> SearchHit | None:
    """Best line of the docs for ``query``: most distinct query words (3+ letters) present."""
    words = {w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) > 2}
    best: SearchHit | None = None
    for path in files if files is not None else doc_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found = set(re.findall(r"[a-z0-9]+", line.lower()))
            score = len(words & found)
            if score and (best is None or score > best.score):
                text = line.strip().lstrip("#|- ").strip()[:160]
                shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                best = SearchHit(path=str(shown), line=number, text=text, score=score)
    return best
