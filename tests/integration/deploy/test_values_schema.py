"""Bad values fail at install time with an error that names the field to fix."""

from __future__ import annotations

import helm_python as helm
import pytest

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

# (case, values, the field path the error must name). Helm merges these over values.yaml;
# null deletes a default key, as `--set key=null` does.
SCHEMA_CASES = [
    ("negative GPU workers", {"gpuWorkers": {"replicas": -1}}, "/gpuWorkers/replicas"),
    ("negative pool replicas", {"pool": {"replicas": -2}}, "/pool/replicas"),
    ("empty audit key Secret name", {"security": {"auditSigningKey": {"secretName": ""}}},
     "/security/auditSigningKey/secretName"),
    ("missing audit key Secret name", {"security": {"auditSigningKey": {"secretName": None}}},
     "secretName"),
    ("missing token Secret name", {"security": {"tokenSecret": {"secretName": None}}},
     "secretName"),
    ("empty tenant key Secret name",
     {"security": {"tenantKeys": {"secretNames": ["agentkv-tenant-keys", ""]}}},
     "/security/tenantKeys/secretNames/1"),
    ("tenant Secrets source with no Secret", {"security": {"tenantKeys": {"secretNames": []}}},
     "/security/tenantKeys/secretNames"),
    ("CSI source without a SecretProviderClass",
     {"security": {"tenantKeys": {"source": "csi"}}},
     "/security/tenantKeys/csi/secretProviderClass"),
    ("external Redis without its URL Secret", {"redis": {"mode": "external"}},
     "/redis/external/urlSecret/name"),
    ("Redis TLS without a certificate Secret",
     {"redis": {"bundled": {"tls": {"enabled": True}}}}, "/redis/bundled/tls/secretName"),
    ("Ray token auth without a Secret", {"ray": {"auth": {"secretName": ""}}},
     "/ray/auth/secretName"),
    ("pool below the smallest page", {"pool": {"hostPoolBytes": 4096}}, "/pool/hostPoolBytes"),
    ("pool size not an integer", {"pool": {"hostPoolBytes": "16Gi"}}, "/pool/hostPoolBytes"),
    ("misspelt key", {"pool": {"replica": 3}}, "replica"),
    ("pool smaller than a page",
     {"pool": {"hostPoolBytes": 2 << 20}, "service": {"pageBytes": 4 << 20}},
     "/pool/hostPoolBytes"),
    ("NVMe shard smaller than a page", {"pool": {"nvme": {"bytes": 1 << 20}}},
     "/pool/nvme/bytes"),
    ("page size not a power of two", {"service": {"pageBytes": 3 << 20}}, "/service/pageBytes"),
    ("64 MiB page: no frame room for its envelope", {"service": {"pageBytes": 64 << 20}},
     "/service/pageBytes"),
    ("per-pod keys on a multi-node cluster",
     {"security": {"tenantKeys": {"source": "ephemeral"}}}, "/security/tenantKeys/source"),
    ("ACL namespace the directory cannot have",
     {"redis": {"bundled": {"tenantUsers": [{"username": "akv-a", "namespace": "a:b",
                                             "passwordSecret": {"name": "s", "key": "p"}}]}}},
     "/redis/bundled/tenantUsers/0/namespace"),
]

# Checks across fields, done by templates/validate.yaml (the message names the field too).
# `helm lint` evaluates `fail` in lint mode (logged, not raised), so only render is checked.
TEMPLATE_CASES = [
    ("no node hosts a pool", {"pool": {"enabled": False}}, "/pool/enabled"),
    ("no HBM page actor", {"gpuWorkers": {"enabled": False}}, "/gpuWorkers/enabled"),
    ("page over the frame limit", {"service": {"maxFrameBytes": 1 << 20}}, "/service/pageBytes"),
    ("page plus envelope over the frame limit",
     {"service": {"pageBytes": 32 << 20, "maxFrameBytes": (32 << 20) + (64 << 10) - 1}},
     "/service/pageBytes"),
    ("head pool's NVMe shard over its emptyDir",
     {"head": {"hostPool": True, "resources": {"requests": {"memory": "32Gi"},
                                               "limits": {"memory": "32Gi"}}}},
     "/head/scratchBytes"),
    ("GPU worker pool's NVMe shard over its emptyDir", {"gpuWorkers": {"hostPool": True}},
     "/gpuWorkers/scratchBytes"),
]


@pytest.mark.parametrize("case,values,field", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_rejects_with_the_field_named(case, values, field):
    with pytest.raises(helm.HelmValuesError) as info:
        chart.render_values(values)
    assert field in str(info.value), str(info.value)
    report = chart.lint(values)
    assert any(field in e for e in report["errors"]), report["errors"]


@pytest.mark.parametrize("case,values,field", TEMPLATE_CASES, ids=[c[0] for c in TEMPLATE_CASES])
def test_cross_field_checks_name_the_field(case, values, field):
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render_values(values)
    assert f"at '{field}'" in str(info.value), str(info.value)


def test_defaults_and_value_sets_pass_the_schema():
    with helm.Chart.load(chart.CHART) as loaded:
        for name in chart.VALUE_SETS:
            loaded.validate_schema(loaded.merge_values(chart.load_values(name)))
