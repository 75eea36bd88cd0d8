"""Probe timings against the service's own deadlines, and what `helm upgrade` may change:
the fields Kubernetes keeps immutable (selectors, a StatefulSet's volume claims) must not
move with values an operator changes between releases."""

from __future__ import annotations

import copy

import helm_python as helm
import pytest
import yaml

from agentkv_cluster.runtime.readiness import READY_DEADLINE_S
from tests.integration.deploy import chart

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_readiness_probe_outwaits_the_services_readiness_deadline(value_set):
    """/readyz answers within READY_DEADLINE_S, hung parts or not; a probe that timed out
    first would take a slow-but-ready head out of the Service."""
    probe = chart.container(chart.pod_templates(value_set)["head"], "agentkv")["readinessProbe"]
    assert probe["timeoutSeconds"] >= READY_DEADLINE_S + 1
    assert probe["periodSeconds"] > READY_DEADLINE_S


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
@pytest.mark.parametrize("kind", ["startupProbe", "livenessProbe"])
def test_health_probes_outwait_the_controllers_liveness_ping(value_set, kind):
    """/healthz pings the controller for up to READY_DEADLINE_S (``Service.alive``); a
    probe left at Kubernetes' 1 s default counted a slow controller's answer as a failure."""
    probe = chart.container(chart.pod_templates(value_set)["head"], "agentkv")[kind]
    assert probe["httpGet"]["path"] == "/healthz"
    assert probe.get("timeoutSeconds", 1) >= READY_DEADLINE_S + 1


# Values an operator changes between releases (sizes, replicas, image, labels, knobs).
UPGRADE = {
    "image": {"tag": "9.9.9"},
    "commonLabels": {"team": "kv"},
    "service": {"topTenants": 50, "tenantNames": True},
    "head": {"podLabels": {"rollout": "b"}, "podDisruptionBudget": {"enabled": True}},
    "gpuWorkers": {"replicas": 7, "podLabels": {"rollout": "b"}},
    "pool": {"replicas": 5, "podLabels": {"rollout": "b"}, "nvme": {"fsync": True},
             "hostPoolBytes": 8 << 30, "updateStrategy": {"type": "OnDelete"}},
    "redis": {"bundled": {"podLabels": {"rollout": "b"}, "maxmemoryBytes": 2 << 30,
                          "podDisruptionBudget": {"enabled": True}}},
    "monitoring": {"prometheusRule": {"enabled": True}},
}


def _immutable(values: dict | None) -> dict[tuple[str, str], object]:
    """(kind, name) -> the fields the API server refuses to change on an update."""
    out: dict[tuple[str, str], object] = {}
    for path, text in chart.render_values(values).items():
        if path.endswith("NOTES.txt"):
            continue
        for d in yaml.safe_load_all(text):
            if not d:
                continue
            key = (d["kind"], d["metadata"]["name"])
            if d["kind"] == "StatefulSet":
                out[key] = (d["spec"]["selector"], d["spec"]["serviceName"],
                            d["spec"].get("volumeClaimTemplates"),
                            d["spec"].get("podManagementPolicy"))
            elif d["kind"] in ("PodDisruptionBudget", "Service"):
                out[key] = d["spec"].get("selector")
            elif d["kind"] == "PersistentVolumeClaim":
                out[key] = (d["spec"]["accessModes"], d["spec"].get("storageClassName"))
    return out


def test_immutable_fields_do_not_move_with_the_values_an_upgrade_changes():
    before, after = _immutable(None), _immutable(copy.deepcopy(UPGRADE))
    assert {k: after[k] for k in before if k in after} == before
    assert ("StatefulSet", "agentkv-pool") in before and ("StatefulSet", "agentkv-redis") in before


def test_the_immutable_field_check_sees_a_changed_volume_claim():
    """The volume claims are immutable: a new NVMe size is refused by the API server on
    upgrade (docs/operations.md, "Upgrade"), and this check tells the two renders apart."""
    before, after = _immutable(None), _immutable({"pool": {"nvme": {"bytes": 200 << 30}}})
    assert before[("StatefulSet", "agentkv-pool")] != after[("StatefulSet", "agentkv-pool")]


AUDIT_OFF = {"security": {"audit": {"persistence": {"enabled": False}}}}


def _upgrade_docs(values: dict | None) -> list[dict]:
    """The objects `helm upgrade` of the default release applies with these values."""
    with helm.Chart.load(chart.CHART) as loaded:
        out = loaded.render(values, name=chart.RELEASE, namespace=chart.NAMESPACE,
                            is_upgrade=True)
    return [d for path, text in out.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def _audit_volume(docs: list[dict]) -> dict:
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    return chart.volume(cluster["spec"]["headGroupSpec"]["template"], "audit-log")


def test_an_upgrade_that_turns_audit_persistence_off_is_refused_unless_acknowledged():
    """Turning security.audit.persistence off on upgrade rendered without a word: the audit
    PVC (helm.sh/resource-policy keep) left the release, and the head's next pod wrote a new
    chain, unlinked to the old log, to an emptyDir it loses with the pod."""
    before = _upgrade_docs(None)
    (claim,) = [d for d in before if d["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert _audit_volume(before)["persistentVolumeClaim"]["claimName"] == \
        claim["metadata"]["name"]
    with pytest.raises(helm.HelmRenderError) as info:
        _upgrade_docs(copy.deepcopy(AUDIT_OFF))
    message = str(info.value)
    assert "security.audit.persistence.acknowledgeEphemeralLog: true" in message
    assert claim["metadata"]["name"] in message  # the claim it leaves behind, by name
    acknowledged = copy.deepcopy(AUDIT_OFF)
    acknowledged["security"]["audit"]["persistence"]["acknowledgeEphemeralLog"] = True
    after = _upgrade_docs(acknowledged)
    assert not [d for d in after if d["kind"] == "PersistentVolumeClaim"]
    assert _audit_volume(after) == {"name": "audit-log", "emptyDir": {}}
