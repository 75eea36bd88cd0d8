"""docs/protocol.md's example, run as written against a service with the default page
limit (only the port is the test's own), and the documented empty-list behaviour."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from agentkv_cluster.api.protocol import RemoteError
from agentkv_cluster.config import load_config
from agentkv_cluster.runtime.service import Service

pytestmark = pytest.mark.integration
DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()


@pytest.fixture(scope="module")
def service():
    workdir = Path(tempfile.mkdtemp(prefix="agentkv-protocol-doc-"))
    cfg = load_config(env={}, overrides={  # the default page limit (4 MiB) on purpose
        "api": {"port": 0}, "hbm": {"num_pages": 4},
        "pool": {"pool_bytes": 64 << 20, "nvme_dir": str(workdir / "nv")}})
    assert cfg.hbm.page_bytes == 4 << 20
    svc = Service(cfg, workdir=workdir).start(local=True)
    yield svc
    svc.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def test_the_example_runs_as_written(service, tmp_path, monkeypatch) -> None:
    (block,) = re.findall(r"## Example \(Python\).*?```python\n(.*?)```", DOC, re.DOTALL)
    assert '("127.0.0.1", 7420)' in block
    code = block.replace('("127.0.0.1", 7420)', repr(tuple(service.address)))
    (tmp_path / "acme.token").write_text(service.token("acme") + "\n")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/protocol.md", "exec"), {})  # noqa: S102 - the doc's own code


def test_a_page_over_the_limit_is_bad_args(service) -> None:
    """What the example used to do: a 256-token page is 5.6 MiB, over the 4 MiB limit."""
    from tests.integration.runtime.test_cluster import identity

    with service.client("acme") as c:
        s = c.open_session("big")
        with pytest.raises(RemoteError) as info:
            s.store_pages([{"page_id": 0, "identity": identity("acme", "big", 0).pack(),
                            "data": bytes(2 * 30 * 3 * 256 * 64 * 2)}])
        assert info.value.code == "bad_args"


def test_empty_lists_succeed_on_an_unknown_session_as_documented(service) -> None:
    from tests.integration.runtime.test_cluster import identity

    with service.client("acme") as c:
        c.open_session("known")
        assert c.call("store_pages", {"session": "nope", "pages": []}) == {"keys": []}
        assert c.call("lookup_prefix", {"session": "nope", "identities": []}) == {
            "length": 0, "keys": [], "refused": ""}
        with pytest.raises(RemoteError) as info:
            c.call("lookup_prefix", {"session": "nope",
                                     "identities": [identity("acme", "nope", 0).pack()]})
        assert info.value.code == "not_found"
