"""docs/metrics.md against the exposition of a running service, as Prometheus scrapes it:
every family it serves is listed there with its type and labels (the suffixes a family's
samples carry included), every label value it serves is one the label table lists, and
the exposition parses (and passes ``promtool check metrics`` where promtool is installed)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentkv_cluster.api.server import PreAuthLimits
from tests.integration.runtime.test_cluster import identity, kv_page
from tests.support.local_service import local_service

pytestmark = pytest.mark.integration

DOC = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
PAGE = 2 * 2 * 2 * 128 * 64 * 2  # kv_page(): 128 KiB
TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram"}


def table(header: str) -> dict[str, list[str]]:
    """First column -> the other columns of the markdown table under ``header``."""
    section = DOC.split(header, 1)[1].split("\n## ", 1)[0]
    return {m[1]: [c.strip() for c in m[2].split(" | ")]
            for m in re.finditer(r"^\| `([a-z_]+)` \| (.+) \|$", section, re.MULTILINE)}


def documented_values(label: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", table("## Labels and their cardinality")[label][0]))


@pytest.fixture(scope="module")
def exposition() -> Iterator[str]:
    with local_service("agentkv-metrics-doc-", page_bytes=PAGE, hbm_pages=8, pool_bytes=4 << 20,
                       hbm_capacity=3 * PAGE, metrics_http=True) as svc:
        with svc.client("acme") as client:
            s = client.open_session("s")
            ids = [identity("acme", "s", 1000 * i) for i in range(3)]
            keys = s.store_pages([kv_page(i, "evidence", ident) for i, ident in enumerate(ids)])
            s.lookup_prefix([ident.pack() for ident in ids])
            s.load(keys)
            s.release(keys)
            s.close()
        svc.server.preauth = replace(PreAuthLimits(), per_source=1)
        first = socket.create_connection(svc.address)  # evicted by the second, unauthenticated
        time.sleep(0.05)
        second = socket.create_connection(svc.address)
        first.settimeout(5.0)
        try:
            assert first.recv(1) == b""
        except ConnectionResetError:  # aborted by the server
            pass
        first.close()
        second.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{svc.http.port}/metrics",
                                    timeout=60) as r:
            yield r.read().decode()


def test_every_served_family_is_documented_with_its_type_and_labels(exposition) -> None:
    rows = table("## Service metrics")
    created = "`_created`" in DOC.split("## Labels", 1)[0]
    seen = set()
    for fam in text_string_to_metric_families(exposition):
        if not fam.name.startswith("agentkv_"):
            continue
        name = fam.name
        if name.endswith("_created") and name not in rows:
            assert created, f"{name} is served but docs/metrics.md never says what it is"
            name = name.removesuffix("_created")
            assert fam.type == "gauge" and name in rows, fam.name
            continue
        seen.add(name)
        kind, labels = rows[name][0], rows[name][1]
        assert kind.startswith(TYPES[fam.type]), name
        documented = set(re.findall(r"`([a-z_]+)`", labels))
        served = {k for s in fam.samples for k in s.labels} - {"le"}
        if fam.samples:  # a labelled family shows its labels once it has a series
            assert served == documented, name
    assert seen == set(rows)  # nothing documented that is not served


@pytest.mark.parametrize("label", ["op", "code", "tier", "source", "result", "part",
                                   "reason"])
def test_every_served_label_value_is_listed_in_the_label_table(exposition, label) -> None:
    served = {s.labels[label] for fam in text_string_to_metric_families(exposition)
              if fam.name.startswith("agentkv_") for s in fam.samples if label in s.labels}
    listed = documented_values(label)
    if label == "part":  # `pool/` + the pool's name
        served = {v.split("/", 1)[0] + "/" if "/" in v else v for v in served}
    assert served - listed == set()


def test_the_exposition_passes_promtool(exposition) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    done = subprocess.run([promtool, "check", "metrics"], input=exposition, text=True, check=False,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
