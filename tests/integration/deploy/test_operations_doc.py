"""Every `agentkv` command in docs/operations.md, and the one the chart runs, parses with
the real command line."""

from __future__ import annotations

import re
import shlex

import pytest

from agentkv_cluster.cli import build_parser
from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

DOC = chart.REPO / "docs" / "operations.md"
SHELL_END = re.compile(r"\s*(>&2|>|\||;|&&|'\s*$|\)\s*$).*$")


def _commands() -> list[str]:
    text = DOC.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    logical = "\n".join(blocks).replace("\\\n", " ")
    found = []
    for line in logical.splitlines():
        for match in re.finditer(r"(?:^|[\s(])(agentkv (?:tenant|audit|serve|demo|simulate)\b.*)",
                                 line):
            command = match.group(1)
            command = command.replace("'$T'", "acme")  # sh -c '...'$T'...' splices
            command = SHELL_END.sub("", command)
            command = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", "x", command)
            found.append(command)
    return found


def test_doc_has_the_operations():
    verbs = {" ".join(c.split()[1:3]) for c in _commands()}
    assert {"tenant create", "tenant rotate", "tenant erase", "audit keygen",
            "audit receipt", "audit verify"} <= verbs


@pytest.mark.parametrize("command", _commands())
def test_command_parses(command):
    argv = shlex.split(command)[1:]
    args = build_parser().parse_args(argv)  # argparse exits (status 2) on a bad flag
    assert callable(args.handler)


def test_chart_serve_command_parses():
    import importlib.util

    if importlib.util.find_spec("agentkv_cluster.cli.serve") is None:
        pytest.skip("agentkv_cluster/cli/serve.py is not built yet")
    head = chart.pod_templates("default")["head"]
    command = chart.container(head, "agentkv")["command"]
    assert command[0] == "agentkv"
    args = build_parser().parse_args(command[1:])
    assert args.command == "serve" and callable(args.handler)
