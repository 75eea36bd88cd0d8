"""What the rendered objects promise: who reaches what, least privilege, sizes, probes."""

from __future__ import annotations

import pytest

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

SELECTOR = {"app.kubernetes.io/name": "agentkv", "app.kubernetes.io/instance": chart.RELEASE}
RAY_NODES = ("head", "hbm-gpu", "pool")


def _labels(value_set: str) -> dict[str, dict[str, str]]:
    return {name: t["metadata"]["labels"] for name, t in chart.pod_templates(value_set).items()}


@pytest.mark.parametrize("value_set", ["default", "production-8gpu-4node"])
def test_only_ray_pods_reach_redis_and_only_on_its_port(value_set):
    policy = chart.one(value_set, "NetworkPolicy", "-redis")["spec"]
    labels = _labels(value_set)
    assert set(chart.pod_templates(value_set)) == {*RAY_NODES, "redis"}
    assert [n for n, lab in labels.items() if chart.matches(policy["podSelector"]["matchLabels"],
                                                            lab)] == ["redis"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace, no namespaceSelector
    allowed = [n for n, lab in labels.items() if chart.matches(peer["podSelector"]["matchLabels"],
                                                               lab)]
    assert sorted(allowed) == sorted(RAY_NODES)  # controller (head) and pool actors
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_only_engine_namespaces_reach_the_wire_port(value_set):
    values = chart.load_values(value_set) or {}
    engines = values.get("networkPolicy", {}).get("engineNamespaces", ["inference"])
    policy = chart.one(value_set, "NetworkPolicy", "-wire")["spec"]
    labels = _labels(value_set)
    assert [n for n, lab in labels.items()
            if chart.matches(policy["podSelector"]["matchLabels"], lab)] == ["head"]
    wire = [r for r in policy["ingress"] if r["ports"][0]["port"] == 7420]
    (rule,) = wire
    (peer,) = rule["from"]
    assert peer == {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": engines}]}}
    others = [r["ports"] for r in policy["ingress"] if r is not rule]
    assert others in ([], [[{"port": 9420, "protocol": "TCP"}]])  # metrics for monitoring only
    # The Service engines use exposes exactly the wire and metrics ports of the head.
    svc = chart.one(value_set, "Service", "agentkv")["spec"]
    assert chart.matches(svc["selector"], labels["head"])
    assert [(p["name"], p["port"]) for p in svc["ports"]] == [("wire", 7420), ("metrics", 9420)]


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_ray_ports_are_open_only_between_ray_pods(value_set):
    policy = chart.one(value_set, "NetworkPolicy", "-ray")["spec"]
    labels = _labels(value_set)
    members = sorted(n for n, lab in labels.items()
                     if chart.matches(policy["podSelector"]["matchLabels"], lab))
    assert members == sorted(n for n in RAY_NODES if n in labels)
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": policy["podSelector"]}] and "ports" not in rule


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_least_privilege_identity(value_set):
    assert chart.by_kind(value_set, "Role") == chart.by_kind(value_set, "ClusterRole") == []
    assert chart.by_kind(value_set, "RoleBinding") == []
    sa = chart.one(value_set, "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False
    for name, template in chart.pod_templates(value_set).items():
        spec = template["spec"]
        assert spec["serviceAccountName"] == sa["metadata"]["name"], name
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert {"requests", "limits"} <= set(c["resources"]), (name, c["name"])


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_service_probes_use_the_real_health_endpoints(value_set):
    head = chart.pod_templates(value_set)["head"]
    svc = chart.container(head, "agentkv")
    ports = {p["name"]: p["containerPort"] for p in svc["ports"]}
    # Not "metrics": KubeRay gives the Ray container a port of that name (test_operator_overrides).
    assert ports == {"akv-wire": 7420, "akv-metrics": 9420}
    assert svc["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "akv-metrics"}
    assert svc["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "akv-metrics"}
    assert svc["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "akv-metrics"}
    assert head["spec"]["containers"][0]["name"] == "ray-head"  # KubeRay's Ray container first


def test_service_monitor_scrapes_the_metrics_port():
    monitor = chart.one("production-8gpu-4node", "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    svc = chart.one("production-8gpu-4node", "Service", "agentkv")
    assert chart.matches(monitor["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [chart.NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scheme": "http"}]
    assert chart.by_kind("default", "ServiceMonitor") == []  # off unless the CRDs exist


@pytest.mark.parametrize("value_set", ["default", "production-8gpu-4node", "external-redis-tls"])
def test_pool_spreads_over_nodes_and_keeps_its_nvme_volume(value_set):
    values = chart.load_values(value_set) or {}
    with_defaults = {"antiAffinity": "required", "replicas": 2,
                     "nvme": {"storageClass": "local-nvme", "bytes": 100 << 30}}
    pool_values = {**with_defaults, **values.get("pool", {})}
    sts = chart.one(value_set, "StatefulSet", "-pool")
    template = sts["spec"]["template"]
    assert sts["spec"]["replicas"] == pool_values["replicas"]
    affinity = template["spec"]["affinity"]["podAntiAffinity"]
    if pool_values["antiAffinity"] == "required":
        (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    else:
        (weighted,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        term = weighted["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert chart.matches(term["labelSelector"]["matchLabels"], template["metadata"]["labels"])
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "nvme"
    assert claim["spec"]["storageClassName"] == pool_values["nvme"]["storageClass"]
    quota = pool_values["nvme"]["bytes"]  # the shard's quota, with room to compact past it
    room = quota + (256 << 20) + quota // 64
    assert chart.quantity_bytes(claim["spec"]["resources"]["requests"]["storage"]) == \
        -(-room // (1 << 20)) << 20
    pdb = chart.one(value_set, "PodDisruptionBudget", "-pool")["spec"]
    assert pdb["maxUnavailable"] == 1
    assert chart.matches(pdb["selector"]["matchLabels"], template["metadata"]["labels"])


# value set -> Ray pod -> /dev/shm bytes: object store + host pool (if hosted) + headroom
MiB, GiB = 1 << 20, 1 << 30
SHM = {
    "default": {"head": 2 * GiB + 256 * MiB, "hbm-gpu": 4 * GiB + 1 * GiB,
                "pool": 16 * GiB + 1 * GiB + 256 * MiB},
    "cpu-demo": {"head": 256 * MiB + 1 * GiB + 128 * MiB},
    "production-8gpu-4node": {"head": 4 * GiB + 256 * MiB, "hbm-gpu": 32 * GiB + 2 * GiB,
                              "pool": 256 * GiB + 8 * GiB + 1 * GiB},
    "external-redis-tls": {"head": 2 * GiB + 256 * MiB, "hbm-gpu": 4 * GiB + 1 * GiB,
                           "pool": 32 * GiB + 1 * GiB + 256 * MiB},
}


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_dev_shm_is_memory_backed_sized_and_fits_the_memory_limit(value_set):
    for name, template in chart.pod_templates(value_set).items():
        if name == "redis":
            continue
        shm = chart.volume(template, "dshm")["emptyDir"]
        assert shm["medium"] == "Memory"
        size = chart.quantity_bytes(shm["sizeLimit"])
        assert size == SHM[value_set][name], name
        ray = template["spec"]["containers"][0]  # tmpfs pages are charged to its cgroup
        assert {"name": "dshm", "mountPath": "/dev/shm"} in ray["volumeMounts"]
        assert chart.quantity_bytes(ray["resources"]["limits"]["memory"]) > size, name
