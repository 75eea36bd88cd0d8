"""Object names of long or dotted releases: unique per release, valid DNS labels, stable.

Names used to be cut at 40 characters, so two releases whose names shared a 40-character
prefix rendered the same object names and the second install collided with the first.
A release name with dots (Helm allows them) named every object with them, the Services
too, which the API server refuses (a Service name is a DNS-1035 label).
"""

from __future__ import annotations

import hashlib
import re

import helm_python as helm
import pytest
import yaml

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# Helm's own limit on a release name is 53 characters; these two share their first 52.
LONG_A = "inference-platform-us-east-1-production-agentkv-blue"
LONG_B = "inference-platform-us-east-1-production-agentkv-blux"
KUBERAY_SUFFIXES = ("-head-svc", "-head-xxxxx", "-hbm-gpu-worker-xxxxx")  # names KubeRay derives
REVISION_HASH = "-" + "x" * 10  # controller-revision-hash label: <statefulset>-<hash>
# Helm accepts release names made of DNS labels joined by dots (a DNS subdomain).
DOTTED = "my.release"
LONG_DOTTED = "inference.platform.us-east-1.production.blue"


def _docs(release: str, values: dict | None = None) -> list[dict]:
    out = chart.render_values(values, release=release)
    return [d for path, text in out.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def _names(docs: list[dict]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def _derived_names(docs: list[dict]) -> list[str]:
    """Names Kubernetes and KubeRay make from the chart's: pods, claims, label values."""
    out: list[str] = []
    for d in docs:
        name = d["metadata"]["name"]
        if d["kind"] == "RayCluster":
            out += [name + s for s in KUBERAY_SUFFIXES]
        elif d["kind"] == "StatefulSet":
            last = f"{name}-{d['spec']['replicas'] - 1}"
            out += [last, name + REVISION_HASH]
            out += [f"{t['metadata']['name']}-{last}" for t in d["spec"]["volumeClaimTemplates"]]
    return out


def test_the_test_releases_are_valid_and_share_the_old_cut():
    for release in (LONG_A, LONG_B, DOTTED, LONG_DOTTED):
        helm.validate_release_name(release)
    assert LONG_A != LONG_B and LONG_A[:40] == LONG_B[:40]


def test_two_long_releases_sharing_a_prefix_name_no_object_alike():
    a, b = _docs(LONG_A), _docs(LONG_B)
    assert _names(a) and _names(a).isdisjoint(_names(b))
    assert set(_derived_names(a)).isdisjoint(_derived_names(b))


@pytest.mark.parametrize("release", [LONG_A, "a" * 53, "agentkv", "kv-" + "x" * 37 + "-y",
                                     DOTTED, LONG_DOTTED, "agentkv.prod"])
def test_every_name_is_a_dns_label_of_at_most_63(release):
    docs = _docs(release, {"monitoring": {"dashboard": {"enabled": True},
                                          "prometheusRule": {"enabled": True}},
                           "serviceMonitor": {"enabled": True},
                           "head": {"podDisruptionBudget": {"enabled": True}},
                           "redis": {"bundled": {"podDisruptionBudget": {"enabled": True}}}})
    names = [n for _, n in _names(docs)] + _derived_names(docs)
    for name in names:
        assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    assert len(cluster["metadata"]["name"]) <= 40


def test_a_long_name_keeps_a_prefix_and_a_hash_of_the_whole_name():
    # A release name that contains the chart's name is the full name on its own.
    (cluster,) = [d for d in _docs(LONG_A) if d["kind"] == "RayCluster"]
    digest = hashlib.sha256(LONG_A.encode()).hexdigest()[:8]
    assert cluster["metadata"]["name"] == f"{LONG_A[:31]}-{digest}"
    assert _names(_docs(LONG_A)) == _names(_docs(LONG_A))  # stable across renders (upgrades)


def test_a_cut_that_ends_in_a_dash_leaves_no_dash_before_the_hash():
    release = "team-" + "b" * 25 + "--" + "c" * 20  # characters 31-32 are dashes
    (cluster,) = [d for d in _docs(release) if d["kind"] == "RayCluster"]
    full = f"{release}-agentkv"
    name = cluster["metadata"]["name"]
    assert name == "team-" + "b" * 25 + "-" + hashlib.sha256(full.encode()).hexdigest()[:8]
    assert "--" not in name


def test_names_of_40_characters_or_fewer_are_unchanged():
    release = "kv-" + "x" * 29  # "<release>-agentkv" is exactly 40
    names = {n for k, n in _names(_docs(release)) if k in ("RayCluster", "Service")}
    assert f"{release}-agentkv" in names
    assert "agentkv" in {n for k, n in _names(_docs("agentkv")) if k == "RayCluster"}


def test_a_dotted_release_gets_dashes_and_a_hash_of_the_whole_name():
    full = f"{DOTTED}-agentkv"
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    docs = _docs(DOTTED)
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    assert cluster["metadata"]["name"] == f"my-release-agentkv-{digest}"
    assert {n for k, n in _names(docs) if k == "Service"} == {
        f"my-release-agentkv-{digest}", f"my-release-agentkv-{digest}-pool",
        f"my-release-agentkv-{digest}-redis"}
    # Label values may hold dots: the selectors keep the release name as Helm knows it.
    assert cluster["metadata"]["labels"]["app.kubernetes.io/instance"] == DOTTED


def test_a_dotted_release_and_its_dashed_twin_name_no_object_alike():
    # Both are valid release names, and may live in one namespace.
    dotted, dashed = _docs(DOTTED), _docs(DOTTED.replace(".", "-"))
    assert _names(dotted).isdisjoint(_names(dashed))
    assert set(_derived_names(dotted)).isdisjoint(_derived_names(dashed))


@pytest.mark.parametrize("release", [LONG_A, DOTTED])
def test_a_long_or_dotted_release_still_wires_its_objects_to_each_other(release):
    docs = _docs(release)
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    rc = cluster["metadata"]["name"]
    sts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert set(sts) == {f"{rc}-pool", f"{rc}-redis"}
    assert {s["spec"]["serviceName"] for s in sts.values()} <= services
    pool = sts[f"{rc}-pool"]["spec"]["template"]["spec"]["containers"][0]
    assert f"--address={rc}-head-svc.{chart.NAMESPACE}.svc.cluster.local:6379" in pool["args"][0]
    head = cluster["spec"]["headGroupSpec"]["template"]
    env = {e["name"]: e.get("value", "") for e in chart.container(head, "agentkv")["env"]}
    assert f"@{rc}-redis.{chart.NAMESPACE}.svc.cluster.local:6379/" in \
        env["AGENTKV_DIRECTORY_REDIS_URL"]


NAME_SCHEMA_CASES = [
    ("full name Kubernetes refuses", {"fullnameOverride": "My_KV"}, "/fullnameOverride"),
    ("full name starting with a digit", {"fullnameOverride": "1kv"}, "/fullnameOverride"),
    ("name label Kubernetes refuses", {"nameOverride": "Kv Store"}, "/nameOverride"),
    ("ServiceAccount name Kubernetes refuses", {"serviceAccount": {"name": "Bad_SA"}},
     "/serviceAccount/name"),
]


@pytest.mark.parametrize("case,values,field", NAME_SCHEMA_CASES,
                         ids=[c[0] for c in NAME_SCHEMA_CASES])
def test_names_kubernetes_refuses_are_refused_naming_the_value(case, values, field):
    with pytest.raises(helm.HelmValuesError) as info:
        chart.render_values(values)
    assert field in str(info.value), str(info.value)


def test_a_release_name_starting_with_a_digit_needs_a_full_name_override():
    # Every Service is named after the full name, and a Service name starts with a letter.
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render_values(None, release="1kv")
    assert "at '/fullnameOverride'" in str(info.value) and "1kv-agentkv" in str(info.value)
    docs = _docs("1kv", {"fullnameOverride": "kv-one"})
    assert {n for k, n in _names(docs) if k == "Service"} == {"kv-one", "kv-one-pool",
                                                               "kv-one-redis"}
