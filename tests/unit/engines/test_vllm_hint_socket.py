"""Taking the ``hint_socket`` path at engine start: a stale socket (an engine that died) is
replaced; another file, or a socket another engine still reads, is a ``HintSocketError``
naming the path and is left alone. A file there used to be deleted, and a second engine
on the path silently took every hint the first one was sent."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from agentkv_cluster.engines.vllm.hintsock import HintSocket, HintSocketError, send_hint

HINT = {"session": "a", "events": [{"kind": "task_start"}]}


def test_a_file_at_the_path_is_refused_and_kept(tmp_path: Path):
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    with pytest.raises(HintSocketError, match="exists and is not a socket"):
        HintSocket(str(path))
    assert path.read_text() == "keep me"


def test_a_socket_another_engine_reads_is_refused_and_keeps_its_hints(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    first = HintSocket(path)
    try:
        with pytest.raises(HintSocketError, match="in use by another process"):
            HintSocket(path)
        send_hint(path, HINT)
        assert len(first.drain()) == 1
    finally:
        first.close()
    assert not os.path.exists(path)


def test_a_stale_socket_is_replaced(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(path)
    dead.close()  # an engine that died: its socket file stays, nobody reads it
    sock = HintSocket(path)
    try:
        send_hint(path, HINT)
        assert len(sock.drain()) == 1
    finally:
        sock.close()


def test_a_path_too_long_for_a_unix_socket_names_the_limit(tmp_path: Path):
    with pytest.raises(HintSocketError, match="longer than the 107 bytes"):
        HintSocket(str(tmp_path / ("x" * 120)))


def test_closing_leaves_a_socket_another_engine_bound_since(tmp_path: Path):
    path = str(tmp_path / "h.sock")
    old = HintSocket(path)
    os.unlink(path)  # an operator cleared it, and a new engine took the path
    new = HintSocket(path)
    try:
        old.close()
        send_hint(path, HINT)
        assert len(new.drain()) == 1
    finally:
        new.close()
