"""Render and inspect the Helm chart with the real Helm v4 library (helm-python-sdk).

Every test renders through here, so a value set is rendered once per session.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "k8s" / "agentkv"
VALUES_DIR = REPO / "deploy" / "k8s" / "values"
GOLDEN_DIR = REPO / "tests" / "golden" / "deploy"
RELEASE = "agentkv"
NAMESPACE = "agentkv"
# "default" is the chart's own values.yaml; the others are the documented value sets.
VALUE_SETS = ("default", "cpu-demo", "production-8gpu-4node", "external-redis-tls")
KUBE_VERSION = "v1.35.0"  # lint target; kubernetes-validate also checks other versions


def load_values(name: str) -> dict[str, Any] | None:
    """A value set as `helm -f` reads it (Helm's own YAML parser); None for the defaults."""
    if name == "default":
        return None
    return helm.values_from_yaml((VALUES_DIR / f"{name}.yaml").read_text())


def render_values(values: dict[str, Any] | None, release: str = RELEASE) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would produce it."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name=release, namespace=NAMESPACE, is_install=True)


@functools.cache
def rendered(name: str) -> tuple[tuple[str, str], ...]:
    out = render_values(load_values(name))
    return tuple(sorted((path, text) for path, text in out.items()
                        if text.strip() and not path.endswith("NOTES.txt")))


def manifest_text(name: str) -> str:
    """One multi-document YAML stream with `# Source:` headers (the golden format)."""
    return "".join(f"---\n# Source: {path}\n{text.strip()}\n" for path, text in rendered(name))


@functools.cache
def documents(name: str) -> list[dict[str, Any]]:
    """Parsed objects, cached: callers that change one must deep-copy it first."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = [d for d in yaml.load_all(manifest_text(name), Loader=loader) if d]
    assert all("kind" in d and "metadata" in d for d in docs)
    return docs


def by_kind(name: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in documents(name) if d["kind"] == kind]


def one(name: str, kind: str, suffix: str = "") -> dict[str, Any]:
    """The single object of ``kind`` whose name ends with ``suffix``."""
    found = [d for d in by_kind(name, kind) if d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def raycluster(name: str) -> dict[str, Any]:
    return one(name, "RayCluster")


def pod_templates(name: str) -> dict[str, dict[str, Any]]:
    """Component name -> pod template of every workload the chart renders."""
    out: dict[str, dict[str, Any]] = {}
    rc = raycluster(name)
    out["head"] = rc["spec"]["headGroupSpec"]["template"]
    for group in rc["spec"]["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]
    for sts in by_kind(name, "StatefulSet"):
        component = sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        out[component] = sts["spec"]["template"]
    return out


def container(template: dict[str, Any], cname: str) -> dict[str, Any]:
    found = [c for c in template["spec"]["containers"] if c["name"] == cname]
    assert len(found) == 1, cname
    return found[0]


def volume(template: dict[str, Any], vname: str) -> dict[str, Any]:
    found = [v for v in template["spec"]["volumes"] if v["name"] == vname]
    assert len(found) == 1, vname
    return found[0]


_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
          "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_bytes(q: str | int) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]i?|k)?", str(q))
    assert m, f"unexpected quantity {q!r}"
    return int(m.group(1)) * _UNITS[m.group(2) or ""]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def resolve_env(env: list[dict[str, Any]], secrets: dict[tuple[str, str], str],
                fields: dict[str, str]) -> dict[str, str]:
    """Container env as the kubelet builds it: secretKeyRef/fieldRef values and $(VAR)."""
    out: dict[str, str] = {}
    for item in env:
        if "value" in item:
            out[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out.get(m[1], m[0]),
                                       item["value"])
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            out[item["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            out[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


SECRET_KEY_RE = re.compile(r"[-._a-zA-Z0-9]+")  # what a Secret's data keys may be


@functools.cache
def merged_values(name: str) -> dict[str, Any]:
    """The values a release of this set actually uses (defaults coalesced, as install does)."""
    with helm.Chart.load(CHART) as chart:
        return chart.merge_values(load_values(name))


def lint(values: dict[str, Any] | None) -> dict[str, Any]:
    return helm.lint(CHART, values, strict=True, kube_version=KUBE_VERSION,
                     namespace=NAMESPACE)


POD_IP = "10.1.2.3"
SECRETS = {  # stand-ins for the Secrets an operator creates (docs/operations.md)
    ("agentkv-ray-auth", "auth_token"): "ray-token",
    ("agentkv-redis-service", "password"): "svc-Pass_word-1",
    ("agentkv-redis-url", "url"): "rediss://agentkv:pw@redis.example.internal:6380/0"
                                  "?ssl_ca_certs=/etc/agentkv/redis-ca/ca.crt",
}
REDIS_HOST = f"{RELEASE}-redis.{NAMESPACE}.svc.cluster.local"


def service_config(value_set: str, tmp_path: Path):
    """The head's AgentKvConfig as `agentkv serve` would load it in the pod, and its container."""
    from agentkv_cluster.config import load_config

    config_map = one(value_set, "ConfigMap", "-config")
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    head = pod_templates(value_set)["head"]
    agentkv = container(head, "agentkv")
    env = resolve_env(agentkv["env"], SECRETS, {"status.podIP": POD_IP})
    assert agentkv["command"] == ["agentkv", "serve", "--config", "/etc/agentkv/config.yaml"]
    return load_config(path, env=env), agentkv
