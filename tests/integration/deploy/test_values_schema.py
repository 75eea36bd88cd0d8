"""Bad values fail at install time with an error that names the field to fix."""

from __future__ import annotations

import json

import helm_python as helm
import pytest

from agentkv_cluster.config import ApiConfig
from tests.integration.deploy import chart
from tests.integration.deploy import test_security_values as pss

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
    # Sizes past int64 once summed rendered a negative /dev/shm sizeLimit ("-8796093021951Mi")
    # and passed the memory-limit check; 1 PiB is the most any one size may be.
    ("pool and object store that overflow /dev/shm",
     {"pool": {"hostPoolBytes": 1 << 62, "objectStoreBytes": 1 << 62,
               "resources": {"requests": {"memory": "8Ei"}, "limits": {"memory": "8Ei"}}}},
     "/pool/hostPoolBytes"),
    ("NVMe shard past int64 once its headroom is added", {"pool": {"nvme": {"bytes": 9 * 10**18}}},
     "/pool/nvme/bytes"),
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
    # A PDB over the single head or Redis pod: 0 was rendered as 1 (`default` drops a 0).
    ("head PDB with minAvailable 0",
     {"head": {"podDisruptionBudget": {"enabled": True, "minAvailable": 0}}},
     "/head/podDisruptionBudget/minAvailable"),
    ("Redis PDB over more pods than there are",
     {"redis": {"bundled": {"podDisruptionBudget": {"enabled": True, "minAvailable": 2}}}},
     "/redis/bundled/podDisruptionBudget/minAvailable"),
    # The schema names a bad property name, not its place.
    ("label key Kubernetes refuses", {"commonLabels": {"team name": "kv"}}, "'team name'"),
    ("label value Kubernetes refuses", {"gpuWorkers": {"podLabels": {"team": "kv store"}}},
     "/gpuWorkers/podLabels/team"),
    # Object names the API server refuses.
    ("Redis CA Secret name Kubernetes refuses",
     {"redis": {"mode": "external", "external": {"urlSecret": {"name": "redis-url"},
                                                 "caSecret": {"name": "Redis_CA"}}}},
     "/redis/external/caSecret/name"),
    ("NVMe storage class name Kubernetes refuses",
     {"pool": {"nvme": {"storageClass": "Local_NVMe"}}}, "/pool/nvme/storageClass"),
    ("Redis storage class name Kubernetes refuses",
     {"redis": {"bundled": {"persistence": {"storageClass": "Fast SSD"}}}},
     "/redis/bundled/persistence/storageClass"),
    # A namespace name is a DNS-1123 label (no dots, at most 63); the patterns took dots.
    ("engine namespace with a dot", {"networkPolicy": {"engineNamespaces": ["team.inference"]}},
     "/networkPolicy/engineNamespaces/0"),
    ("monitoring namespace over 63 characters",
     {"networkPolicy": {"monitoringNamespaces": ["m" * 64]}},
     "/networkPolicy/monitoringNamespaces/0"),
    # Secret, StorageClass, ServiceAccount and SecretProviderClass names are DNS-1123
    # subdomains: labels joined by single dots; the patterns took "a..b" and "a-.b".
    ("Secret name with an empty label",
     {"security": {"tokenSecret": {"secretName": "agentkv..token"}}},
     "/security/tokenSecret/secretName"),
    ("Secret name with a label ending in a dash",
     {"security": {"auditSigningKey": {"secretName": "audit-.key"}}},
     "/security/auditSigningKey/secretName"),
    ("tenant key Secret name with a label starting with a dash",
     {"security": {"tenantKeys": {"secretNames": ["keys.-a"]}}},
     "/security/tenantKeys/secretNames/0"),
    ("audit storage class with an empty label",
     {"security": {"audit": {"persistence": {"storageClass": "fast..ssd"}}}},
     "/security/audit/persistence/storageClass"),
    ("ServiceAccount name with an empty label", {"serviceAccount": {"name": "kv..sa"}},
     "/serviceAccount/name"),
    ("SecretProviderClass name with an empty label",
     {"security": {"tenantKeys": {"source": "csi", "csi": {"secretProviderClass": "a..b"}}}},
     "/security/tenantKeys/csi/secretProviderClass"),
    # These took any string: the chart rendered, and the API server refused the pod or the
    # RayCluster at install (a PriorityClass name is a DNS-1123 subdomain too).
    ("PriorityClass name with capitals", {"pool": {"priorityClassName": "High-Priority"}},
     "/pool/priorityClassName"),
    ("Redis PriorityClass name with an underscore",
     {"redis": {"bundled": {"priorityClassName": "kv_critical"}}},
     "/redis/bundled/priorityClassName"),
    ("Ray auth Secret name with a space", {"ray": {"auth": {"secretName": "ray auth"}}},
     "/ray/auth/secretName"),
    ("Redis TLS Secret name with an empty label",
     {"redis": {"bundled": {"tls": {"secretName": "redis..tls"}}}},
     "/redis/bundled/tls/secretName"),
    ("external Redis URL Secret name with capitals",
     {"redis": {"external": {"urlSecret": {"name": "Redis-URL"}}}},
     "/redis/external/urlSecret/name"),
    # A Secret key is also the file name it is mounted as: never '.', '..' or '..x'.
    ("Secret key '..'", {"security": {"auditSigningKey": {"key": ".."}}},
     "/security/auditSigningKey/key"),
    ("Secret key starting with '..'",
     {"redis": {"bundled": {"adminPasswordSecret": {"key": "..data"}}}},
     "/redis/bundled/adminPasswordSecret/key"),
    # An extended resource name is <DNS subdomain>/<name part of a label key>.
    ("GPU resource with an empty domain label",
     {"gpuWorkers": {"gpuResourceName": "nvidia..com/gpu"}}, "/gpuWorkers/gpuResourceName"),
    ("GPU resource name ending in a dash", {"gpuWorkers": {"gpuResourceName": "nvidia.com/gpu-"}},
     "/gpuWorkers/gpuResourceName"),
]

# Names Kubernetes takes, near the edges of the rules above: each must still pass.
VALID_NAMES = {
    "networkPolicy": {"engineNamespaces": ["inference", "team-a-" + "x" * 56],
                      "monitoringNamespaces": ["0monitoring"]},
    "security": {"tokenSecret": {"secretName": "agentkv.token-v2", "key": ".secret"},
                 "auditSigningKey": {"secretName": "a.b.c", "key": "signing..key.pem"},
                 "audit": {"persistence": {"storageClass": "ebs.csi.aws.com"}}},
    "serviceAccount": {"name": "agentkv.sa"},
    "gpuWorkers": {"gpuResourceName": "nvidia.com/mig-1g.10gb",
                   "priorityClassName": "system-node-critical"},
    "pool": {"priorityClassName": "kv.tier-1"},
}


# Label values and annotation keys Kubernetes refuses, in objects the schema did not check;
# a fractional CPU number, which the RayCluster CRD (int-or-string) refuses.
SCHEMA_CASES += [
    ("ServiceMonitor label value with a space",
     {"serviceMonitor": {"enabled": True, "labels": {"release": "kube prometheus"}}},
     "/serviceMonitor/labels/release"),
    ("dashboard label value over 63 characters",
     {"monitoring": {"dashboard": {"labels": {"grafana_dashboard": "x" * 64}}}},
     "/monitoring/dashboard/labels/grafana_dashboard"),
    ("PrometheusRule label key with a space",
     {"monitoring": {"prometheusRule": {"labels": {"bad key": "x"}}}}, "'bad key'"),
    ("pod annotation key with a space", {"head": {"podAnnotations": {"bad key": "x"}}},
     "'bad key'"),
    ("fractional CPU as a number", {"service": {"resources": {"limits": {"cpu": 0.5}}}},
     "/service/resources/limits/cpu"),
]


def _tenant_user(username: str) -> dict:
    return {"username": username, "namespace": "n0123456789abcdef01234567",
            "passwordSecret": {"name": f"redis-{username}", "key": "password"}}


# Checks across fields, done by templates/validate.yaml (the message names the field too).
# `helm lint` evaluates `fail` in lint mode (logged, not raised), so only render is checked.
TEMPLATE_CASES = [
    ("no node hosts a pool", {"pool": {"enabled": False}}, "/pool/enabled"),
    ("no HBM page actor", {"gpuWorkers": {"enabled": False}}, "/gpuWorkers/enabled"),
    # Zero replicas rendered a cluster with no HBM actor (or no pool) at all.
    ("no GPU worker and no HBM slot on the head", {"gpuWorkers": {"replicas": 0}},
     "/gpuWorkers/replicas"),
    ("no pool pod and no pool elsewhere", {"pool": {"replicas": 0}}, "/pool/replicas"),
    ("GPU workers' pools with no GPU worker",
     {"pool": {"enabled": False}, "head": {"hbmSlots": 1},
      "gpuWorkers": {"hostPool": True, "replicas": 0, "scratchBytes": 120 << 30}},
     "/pool/enabled"),
    ("page over the frame limit", {"service": {"maxFrameBytes": 1 << 20}}, "/service/pageBytes"),
    # The service refused these at start (config_checks.py); the chart rendered them.
    ("a tenant's connections over all of them",
     {"service": {"maxConnections": 8, "tenantConnections": 9}}, "/service/tenantConnections"),
    ("page plus envelope over the frame limit",
     {"service": {"pageBytes": 32 << 20, "maxFrameBytes": (32 << 20) + (64 << 10) - 1}},
     "/service/pageBytes"),
    ("head pool's NVMe shard over its emptyDir",
     {"head": {"hostPool": True, "resources": {"requests": {"memory": "32Gi"},
                                               "limits": {"memory": "32Gi"}}}},
     "/head/scratchBytes"),
    ("GPU worker pool's NVMe shard over its emptyDir", {"gpuWorkers": {"hostPool": True}},
     "/gpuWorkers/scratchBytes"),
    # A limit given with a decimal ("17.1Gi") used to skip the check: the pod was rendered,
    # then OOM-killed once its pool filled.
    ("pool's /dev/shm over a decimal memory limit",
     {"pool": {"resources": {"requests": {"memory": "17Gi"}, "limits": {"memory": "17.1Gi"}}}},
     "/pool/resources/limits/memory"),
    ("pool's /dev/shm over a limit in Ti",
     {"pool": {"resources": {"requests": {"memory": "16Gi"}, "limits": {"memory": "0.016Ti"}}}},
     "/pool/resources/limits/memory"),
    # Limits below requests: every pod of the workload was refused by the API server.
    ("service memory limit below its request",
     {"service": {"resources": {"requests": {"memory": "16Gi"}, "limits": {"memory": "8Gi"}}}},
     "/service/resources/limits/memory"),
    ("pool CPU limit below its request",
     {"pool": {"resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "4"}}}},
     "/pool/resources/limits/cpu"),
    ("GPU worker CPU limit in millicores below its request",
     {"gpuWorkers": {"resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "7500m"}}}},
     "/gpuWorkers/resources/limits/cpu"),
    ("head memory limit below its request",
     {"head": {"resources": {"requests": {"memory": "16Gi"}, "limits": {"memory": "8Gi"}}}},
     "/head/resources/limits/memory"),
    ("Redis memory limit below its request",
     {"redis": {"bundled": {"resources": {"requests": {"memory": "6Gi"},
                                          "limits": {"memory": "5Gi"}}}}},
     "/redis/bundled/resources/limits/memory"),
    # Ports: a Service with one port twice is refused; a port Ray holds in the head pod
    # fails to bind in the agentkv container.
    ("wire and metrics on one port", {"service": {"wirePort": 9420}}, "/service/metricsPort"),
    ("wire port on the Ray GCS", {"service": {"wirePort": 6379}}, "/service/wirePort"),
    ("metrics port on the Ray dashboard", {"service": {"metricsPort": 8265}},
     "/service/metricsPort"),
    ("wire port in Ray's worker port range", {"service": {"wirePort": 12000}},
     "/service/wirePort"),
    # KubeRay starts the head's Ray with metrics-export-port 8080; Ray's autoscaler and
    # dashboard export metrics on 44217 and 44227: the agentkv container failed to bind.
    ("metrics port on KubeRay's Ray metrics exporter", {"service": {"metricsPort": 8080}},
     "/service/metricsPort"),
    ("wire port on the Ray autoscaler's metrics", {"service": {"wirePort": 44217}},
     "/service/wirePort"),
    ("wire port on the Ray dashboard's metrics", {"service": {"wirePort": 44227}},
     "/service/wirePort"),
    # Malformed image references rendered, and every pod sat in InvalidImageName.
    ("tag inside the image repository",
     {"image": {"repository": "ghcr.io/agentkv/agentkv:0.1.0"}}, "/image/repository"),
    ("upper case image repository", {"image": {"repository": "ghcr.io/AgentKV/agentkv"}},
     "/image/repository"),
    ("image tag with a space", {"image": {"tag": "0.1 .0"}}, "/image/tag"),
    ("Redis image tag with a colon", {"redis": {"bundled": {"image": {"tag": ":7.4"}}}},
     "/redis/bundled/image/tag"),
    # maxmemory at or over the container's limit: OOM-killed before noeviction refused.
    ("Redis maxmemory over its memory limit",
     {"redis": {"bundled": {"maxmemoryBytes": 8 << 30}}}, "/redis/bundled/maxmemoryBytes"),
    ("Redis maxmemory with no room for its fork",
     {"redis": {"bundled": {"maxmemoryBytes": 5 << 30}}}, "/redis/bundled/maxmemoryBytes"),
    # The API server refused the StatefulSet (rollingUpdate only with RollingUpdate).
    ("pool OnDelete with rollingUpdate settings",
     {"pool": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": {"partition": 1}}}},
     "/pool/updateStrategy/rollingUpdate"),
    ("Redis OnDelete with rollingUpdate settings",
     {"redis": {"bundled": {"updateStrategy": {"type": "OnDelete",
                                               "rollingUpdate": {"partition": 0}}}}},
     "/redis/bundled/updateStrategy/rollingUpdate"),
    # Prometheus timed the scrape out (at the interval) when a hung actor made it wait 2 s.
    ("scrape interval under the scrape's 2 s wait",
     {"serviceMonitor": {"enabled": True, "interval": "2s"}}, "/serviceMonitor/interval"),
    ("scrape interval in milliseconds",
     {"serviceMonitor": {"enabled": True, "interval": "4999ms"}}, "/serviceMonitor/interval"),
    # Pod labels that replace the chart's own: the StatefulSet's selector no longer
    # matched its pods (the API server refuses it), or the NetworkPolicy lost the pod.
    ("pod label replacing the selector's component",
     {"pool": {"podLabels": {"app.kubernetes.io/component": "x"}}}, "/pool/podLabels"),
    ("common label replacing the release instance",
     {"commonLabels": {"app.kubernetes.io/instance": "other-release"}}, "/commonLabels"),
    ("pod label replacing the Ray member label",
     {"head": {"podLabels": {"agentkv.io/ray-member": "false"}}}, "/head/podLabels"),
    ("common label the chart sets on every object",
     {"commonLabels": {"app.kubernetes.io/version": "1"}}, "/commonLabels"),
    # Redis aborted its start on the ACL file (WARNING: Duplicate user 'agentkv' found).
    ("tenant user named like the service's user",
     {"redis": {"bundled": {"tenantUsers": [_tenant_user("agentkv")]}}},
     "/redis/bundled/tenantUsers/0/username"),
    ("tenant user named like the admin user",
     {"redis": {"bundled": {"tenantUsers": [_tenant_user("default")]}}},
     "/redis/bundled/tenantUsers/0/username"),
    ("two tenant users of one name",
     {"redis": {"bundled": {"tenantUsers": [_tenant_user("akv-acme"), _tenant_user("akv-b"),
                                            _tenant_user("akv-acme")]}}},
     "/redis/bundled/tenantUsers/2/username"),
    # Audit persistence turned off rendered without a word, on upgrade too: the audit PVC
    # left the release and the head's next pod began a new, unlinked chain on an emptyDir.
    ("audit log on an emptyDir, not acknowledged",
     {"security": {"audit": {"persistence": {"enabled": False}}}},
     "/security/audit/persistence/enabled"),
    ("acknowledgement left set with persistence on",
     {"security": {"audit": {"persistence": {"acknowledgeEphemeralLog": True}}}},
     "/security/audit/persistence/acknowledgeEphemeralLog"),
]


# With the restricted Pod Security Standard's and the external Redis TLS cases.
SCHEMA_CASES = SCHEMA_CASES + pss.SCHEMA_CASES
TEMPLATE_CASES = TEMPLATE_CASES + pss.TEMPLATE_CASES


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


def test_names_kubernetes_takes_still_pass():
    assert chart.render_values(VALID_NAMES)
    assert not chart.lint(VALID_NAMES)["errors"]


def test_a_tenants_threads_are_capped_at_the_services_workers():
    """The chart does not set ``api.workers``; its schema caps ``tenantWorkers`` at the
    service's default, above which the service refuses to start."""
    schema = json.loads((chart.CHART / "values.schema.json").read_text())
    cap = schema["properties"]["service"]["properties"]["tenantWorkers"]["maximum"]
    assert cap == ApiConfig().workers
    with pytest.raises(helm.HelmValuesError, match="/service/tenantWorkers"):
        chart.render_values({"service": {"tenantWorkers": cap + 1}})
    assert chart.render_values({"service": {"tenantWorkers": cap}})


def test_defaults_and_value_sets_pass_the_schema():
    with helm.Chart.load(chart.CHART) as loaded:
        for name in chart.VALUE_SETS:
            loaded.validate_schema(loaded.merge_values(chart.load_values(name)))
