"""The chart renders, lints strictly and validates against Kubernetes schemas."""

from __future__ import annotations

import copy
import subprocess
import sys

import kubernetes_validate
import pytest

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

# The oldest version Chart.yaml accepts, the lint target, and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.29", chart.KUBE_VERSION.lstrip("v"), kubernetes_validate.latest_version())
# Kinds without a schema in kubernetes-validate; each is checked by its own test.
CUSTOM_KINDS = {"RayCluster": "test_raycluster.py", "ServiceMonitor": "test_policies.py"}


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_strict_lint_is_clean(value_set):
    report = chart.lint(chart.load_values(value_set))
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert report["errors"] == [] and problems == [], problems
    assert report["total_charts_linted"] == 1


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_every_manifest_validates_strictly(value_set, version):
    checked = []
    for doc in chart.documents(value_set):
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError
        checked.append(doc["kind"])
    assert {"ConfigMap", "Service", "ServiceAccount"} <= set(checked)


def test_kubernetes_validate_cli_strict(tmp_path):
    """The `kubernetes-validate --strict` command line on every rendered value set."""
    files = []
    for name in chart.VALUE_SETS:
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(chart.manifest_text(name))
    run = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k",
                          KUBE_VERSIONS[-1], *map(str, files)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    skipped = {line.split("kind ")[1].split(" ")[0] for line in lines if line.startswith("WARN")}
    assert skipped == set(CUSTOM_KINDS)
    assert sum(line.startswith("INFO") for line in lines) == sum(
        len(chart.documents(n)) for n in chart.VALUE_SETS) - sum(
        d["kind"] in CUSTOM_KINDS for n in chart.VALUE_SETS for d in chart.documents(n))


def test_strict_validation_catches_an_unknown_field():
    """Control: the validator used above rejects a misspelt field."""
    sts = copy.deepcopy(chart.one("default", "StatefulSet", "-pool"))
    sts["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSIONS[-1], strict=True)


def test_value_sets_render_the_expected_objects():
    kinds = {name: sorted((d["kind"], d["metadata"]["name"]) for d in chart.documents(name))
             for name in chart.VALUE_SETS}
    assert kinds["cpu-demo"] == [
        ("ConfigMap", "agentkv-config"), ("NetworkPolicy", "agentkv-ray"),
        ("NetworkPolicy", "agentkv-wire"), ("RayCluster", "agentkv"), ("Service", "agentkv"),
        ("ServiceAccount", "agentkv")]
    production = kinds["production-8gpu-4node"]
    for obj in [("StatefulSet", "agentkv-pool"), ("PodDisruptionBudget", "agentkv-pool"),
                ("StatefulSet", "agentkv-redis"), ("NetworkPolicy", "agentkv-redis"),
                ("ServiceMonitor", "agentkv"), ("PersistentVolumeClaim", "agentkv-audit")]:
        assert obj in production
    external = kinds["external-redis-tls"]
    assert ("StatefulSet", "agentkv-redis") not in external
    assert ("NetworkPolicy", "agentkv-redis") not in external
    assert ("StatefulSet", "agentkv-pool") in external


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_chart_never_creates_secrets(value_set):
    """Key material and passwords come from Secrets the operator creates, never values."""
    assert chart.by_kind(value_set, "Secret") == []
