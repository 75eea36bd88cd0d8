"""Operator overrides that rendered a chart Kubernetes took but that ran broken."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

DIGEST = "sha256:" + "0123456789abcdef" * 4


def _docs(values):
    out = chart.render_values(values)
    text = "".join(f"---\n{t}\n" for p, t in sorted(out.items()) if not p.endswith("NOTES.txt"))
    return [d for d in yaml.safe_load_all(text) if d]


def _kuberay_head_pod(template: dict) -> dict:
    """The head pod as KubeRay creates it: it adds a port named "metrics" (Ray's exporter,
    8080) to the Ray container, the first, unless that container already names one."""
    pod = copy.deepcopy(template)
    ray = pod["spec"]["containers"][0]
    if not any(p.get("name") == "metrics" for p in ray.get("ports", [])):
        ray.setdefault("ports", []).append({"name": "metrics", "containerPort": 8080})
    return pod


def _find_port(pod: dict, svc_port: dict) -> int:
    """Kubernetes' endpoint lookup (podutil.FindPort): a named targetPort is the first
    container port of that name and protocol, containers in order."""
    target = svc_port["targetPort"]
    if isinstance(target, int):
        return target
    for c in pod["spec"]["containers"]:
        for p in c.get("ports", []):
            if p.get("name") == target and p.get("protocol", "TCP") == svc_port["protocol"]:
                return p["containerPort"]
    raise AssertionError(f"no container port named {target}")


# KubeRay's "metrics" port on the Ray container came first, so the Service's metrics port
# (and the ServiceMonitor's scrape) reached Ray's exporter on 8080, never agentkv serve,
# and the NetworkPolicy, open on 9420 only, dropped the scrape.
@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_service_ports_reach_agentkv_serve_in_the_pod_kuberay_builds(value_set):
    pod = _kuberay_head_pod(chart.pod_templates(value_set)["head"])
    config = yaml.safe_load(chart.one(value_set, "ConfigMap", "-config")["data"]["config.yaml"])
    svc = chart.one(value_set, "Service", "agentkv")
    reached = {p["name"]: _find_port(pod, p) for p in svc["spec"]["ports"]}
    assert reached == {"wire": config["api"]["port"], "metrics": config["metrics"]["port"]}
    agentkv = chart.container(pod, "agentkv")
    assert {_find_port(pod, p) for p in svc["spec"]["ports"]} == {
        p["containerPort"] for p in agentkv["ports"]}
    names = [p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])]
    assert len(names) == len(set(names)), names  # no port name twice in the pod


# The namespace went into config.yaml unquoted: "a: b" made the file invalid YAML, "true"
# or "123" a boolean or number the service refused.
@pytest.mark.parametrize("namespace", ["team: a", "true", "123", "#ops"])
def test_any_ray_namespace_reaches_the_service_as_written(namespace, tmp_path):
    from agentkv_cluster.config import load_config

    docs = _docs({"ray": {"namespace": namespace}})
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config")]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    assert load_config(path, env={}).ray.namespace == namespace


# A digest given as the tag rendered "repo:sha256:...": every pod stuck in InvalidImageName.
@pytest.mark.parametrize("tag,ref", [
    (DIGEST, f"ghcr.io/agentkv/agentkv@{DIGEST}"),
    (f"0.1.0@{DIGEST}", f"ghcr.io/agentkv/agentkv:0.1.0@{DIGEST}"),
    ("0.1.0", "ghcr.io/agentkv/agentkv:0.1.0"),
])
def test_image_tag_or_digest_renders_a_pullable_reference(tag, ref):
    docs = _docs({"image": {"tag": tag}, "redis": {"bundled": {"image": {"tag": DIGEST}}}})
    images = set()
    for d in docs:
        spec = d.get("spec", {})
        templates = [spec.get("template")] if d["kind"] == "StatefulSet" else []
        if d["kind"] == "RayCluster":
            templates = [spec["headGroupSpec"]["template"]] + [
                g["template"] for g in spec["workerGroupSpecs"]]
        for t in templates:
            images |= {c["image"] for c in t["spec"]["containers"] + t["spec"].get(
                "initContainers", [])}
    assert images == {ref, f"docker.io/library/redis@{DIGEST}"}


# Helm reads `memory: 30000000000` as a float64: the chart's quantity check saw "3e+10" and
# refused the value (which the schema takes) with a message naming no field.
def test_whole_number_quantities_render():
    gib30 = 30 * 2**30
    docs = _docs({"pool": {"resources": {"requests": {"memory": gib30},
                                         "limits": {"memory": gib30}}}})
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-pool")]
    assert sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "4", "memory": gib30}
