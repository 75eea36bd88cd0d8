"""docs/metrics.md lists every metric the service registers, with its real type and labels."""

from __future__ import annotations

import re
from pathlib import Path

from agentkv_cluster.api.metrics import ServiceMetrics

DOC = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "info": "gauge (info)"}


def _rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for m in re.finditer(r"^\| `(agentkv_[a-z_]+)` \| ([^|]+) \| ([^|]+) \|", DOC, re.MULTILINE):
        rows[m[1]] = (m[2].strip(), m[3].strip())
    return rows


def test_every_service_metric_is_documented_with_its_type_and_labels() -> None:
    rows = _rows()
    families = [f for f in ServiceMetrics().registry.collect() if f.name.startswith("agentkv_")]
    names = {f.name + ("_info" if f.type == "info" else "") for f in families}
    assert names == set(rows)  # nothing missing, nothing stale
    m = ServiceMetrics()
    for family in families:
        name = family.name + ("_info" if family.type == "info" else "")
        kind, labels = rows[name]
        assert kind == TYPES[family.type], name
        metric = next((v for v in vars(m).values()
                       if getattr(v, "_name", None) == family.name), None)
        if metric is not None:
            declared = set(metric._labelnames)
            documented = {x.strip(" `") for x in labels.split(",")} - {"—"}
            assert documented == declared, name


def test_process_metrics_named_in_the_doc_are_exported() -> None:
    text = ServiceMetrics().exposition().decode()
    for name in re.findall(r"`((?:process|python)_[a-z_]+)`", DOC):
        assert re.search(rf"^{name}(_total)?[{{ ]", text, re.MULTILINE), name
