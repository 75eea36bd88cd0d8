"""The agent example's command line (examples/agent_loop.py): flags that cannot work
together stop at once, an unreachable service is one line, not a traceback."""

from __future__ import annotations

import socket

import pytest

from examples.agent_loop import main


@pytest.mark.parametrize("argv", [
    ["--ray"],  # without --service it would run the in-process loop, Ray never used
    ["--connect", "127.0.0.1:7420"],  # the service refuses requests without a token
    ["--service", "--connect", "127.0.0.1:7420", "--token", "t"],
])
def test_flags_that_cannot_work_together_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_an_unreachable_service_is_reported_in_one_line(capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--connect", f"127.0.0.1:{port}", "--token", "t", "--no-compare"]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach AgentKV at 127.0.0.1:{port}" in err
    assert "Traceback" not in err
