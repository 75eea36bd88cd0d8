"""Values that would weaken the pods or the directory's TLS are refused, naming the value.

The pod securityContext was free-form (a root or unconfined pod rendered without a word),
any capability could be added, `extraVolumes` could add any volume (hostPath included),
and an external Redis over TLS rendered with no CA to
verify its certificate against (and, its URL being in a Secret, nothing checked that URL).
"""

from __future__ import annotations

import os
import subprocess

import helm_python as helm
import pytest
import yaml

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration


def _external(**external) -> dict:
    return {"redis": {"mode": "external",
                      "external": {"urlSecret": {"name": "agentkv-redis-url"}, **external}}}


# What the restricted Pod Security Standard allows (kubernetes.io/docs/concepts/security/
# pod-security-standards), as far as the chart's values reach it.
SCHEMA_CASES = [
    ("pod allowed to run as root", {"podSecurityContext": {"runAsNonRoot": False}},
     "/podSecurityContext/runAsNonRoot"),
    ("runAsNonRoot dropped", {"podSecurityContext": {"runAsNonRoot": None}}, "runAsNonRoot"),
    ("root user id", {"podSecurityContext": {"runAsUser": 0}}, "/podSecurityContext/runAsUser"),
    ("unconfined seccomp", {"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}},
     "/podSecurityContext/seccompProfile/type"),
    ("seccomp profile dropped", {"podSecurityContext": {"seccompProfile": None}},
     "seccompProfile"),
    ("Localhost seccomp without its profile",
     {"podSecurityContext": {"seccompProfile": {"type": "Localhost"}}},
     "/podSecurityContext/seccompProfile"),
    ("container field in the pod context", {"podSecurityContext": {"privileged": True}},
     "'privileged'"),
    ("Windows host process", {"podSecurityContext": {"windowsOptions": {"hostProcess": True}}},
     "'windowsOptions'"),
    ("SELinux user", {"podSecurityContext": {"seLinuxOptions": {"user": "system_u"}}},
     "'user'"),
    ("SELinux type outside the container types",
     {"podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}}},
     "/podSecurityContext/seLinuxOptions/type"),
    ("unconfined AppArmor", {"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}},
     "/podSecurityContext/appArmorProfile/type"),
    ("unsafe sysctl",
     {"podSecurityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
     "/podSecurityContext/sysctls/0/name"),
    ("negative group", {"podSecurityContext": {"fsGroup": -1}}, "/podSecurityContext/fsGroup"),
    ("external Redis TLS flag not a boolean", _external(tls={"enabled": "yes"}),
     "/redis/external/tls/enabled"),
]

HOST_ROOT = {"name": "host", "hostPath": {"path": "/"}}

TEMPLATE_CASES = [
    ("external Redis over TLS with no CA", _external(), "/redis/external/caSecret/name"),
    ("external Redis with a CA Secret and the system CAs",
     _external(caSecret={"name": "agentkv-redis-ca"}, tls={"systemCAs": True}),
     "/redis/external/tls/systemCAs"),
    ("plaintext external Redis with a CA Secret",
     _external(caSecret={"name": "agentkv-redis-ca"}, tls={"enabled": False}),
     "/redis/external/tls/enabled"),
    ("plaintext external Redis trusting the system CAs",
     _external(tls={"enabled": False, "systemCAs": True}), "/redis/external/tls/enabled"),
    ("IPC_LOCK on the pool", {"pool": {"capabilities": ["IPC_LOCK"]}}, "/pool/capabilities/0"),
    ("SYS_ADMIN on the head", {"head": {"capabilities": ["NET_BIND_SERVICE", "SYS_ADMIN"]}},
     "/head/capabilities/1"),
    ("NET_RAW on the GPU workers", {"gpuWorkers": {"capabilities": ["NET_RAW"]}},
     "/gpuWorkers/capabilities/0"),
    ("CHOWN on Redis", {"redis": {"bundled": {"capabilities": ["CHOWN"]}}},
     "/redis/bundled/capabilities/0"),
    # extraVolumes rendered a hostPath (or any other) volume as given.
    ("hostPath volume on the pool", {"pool": {"extraVolumes": [HOST_ROOT]}},
     "/pool/extraVolumes/0"),
    ("hostPath after an allowed volume on the head",
     {"head": {"extraVolumes": [{"name": "scratch", "emptyDir": {}}, HOST_ROOT]}},
     "/head/extraVolumes/1"),
    ("NFS volume on the GPU workers",
     {"gpuWorkers": {"extraVolumes": [{"name": "models",
                                       "nfs": {"server": "nfs.example", "path": "/models"}}]}},
     "/gpuWorkers/extraVolumes/0"),
    ("hostPath volume on Redis", {"redis": {"bundled": {"extraVolumes": [HOST_ROOT]}}},
     "/redis/bundled/extraVolumes/0"),
    ("hostPath with only the capabilities opted out",
     {"pool": {"extraVolumes": [HOST_ROOT]},
      "containerSecurity": {"allowCapabilitiesBeyondRestricted": True}},
     "/pool/extraVolumes/0"),
]


def test_the_no_ca_message_names_both_ways_out():
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render_values(_external())
    assert "redis.external.caSecret.name" in str(info.value)
    assert "redis.external.tls.systemCAs: true" in str(info.value)


def test_the_volume_message_names_the_type_and_the_way_out():
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render_values({"pool": {"extraVolumes": [HOST_ROOT]}})
    message = str(info.value)
    assert "hostPath" in message and "pool.extraVolumes" in message
    assert "containerSecurity.allowVolumesBeyondRestricted: true" in message


def test_volumes_within_the_standard_render_and_others_only_when_opted_in():
    allowed = [{"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
               {"name": "extra-config", "configMap": {"name": "extra"}},
               {"name": "kms", "csi": {"driver": "secrets-store.csi.k8s.io"}}]
    (pool,) = [d for d in _docs({"pool": {"extraVolumes": allowed}})
               if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-pool")]
    names = {v["name"] for v in pool["spec"]["template"]["spec"]["volumes"]}
    assert {"models", "extra-config", "kms"} <= names
    opted = _docs({"head": {"extraVolumes": [HOST_ROOT]},
                   "containerSecurity": {"allowVolumesBeyondRestricted": True}})
    (cluster,) = [d for d in opted if d["kind"] == "RayCluster"]
    volumes = cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    assert HOST_ROOT in volumes


def _docs(values: dict) -> list[dict]:
    return [d for path, text in chart.render_values(values).items()
            if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]


def _head_env(docs: list[dict]) -> list[dict]:
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    return chart.container(cluster["spec"]["headGroupSpec"]["template"], "agentkv")["env"]


def _volume_names(docs: list[dict]) -> set[str]:
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    return {v["name"] for v in cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]}


def test_explicit_choices_render():
    system = _docs(_external(tls={"systemCAs": True}))
    assert "redis-ca" not in _volume_names(system)  # nothing to mount: the image's bundle
    url = [e for e in _head_env(system) if e["name"] == "AGENTKV_DIRECTORY_REDIS_URL"]
    assert url[0]["valueFrom"]["secretKeyRef"] == {"name": "agentkv-redis-url", "key": "url"}
    plain = _docs(_external(tls={"enabled": False}))
    assert "redis-ca" not in _volume_names(plain)
    with_ca = _docs(_external(caSecret={"name": "agentkv-redis-ca"}))
    assert "redis-ca" in _volume_names(with_ca)
    pinned = _docs({"pool": {"capabilities": ["IPC_LOCK"]},
                    "containerSecurity": {"allowCapabilitiesBeyondRestricted": True}})
    (pool,) = [d for d in pinned if d["kind"] == "StatefulSet"
               and d["metadata"]["name"].endswith("-pool")]
    caps = pool["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert _docs({"head": {"capabilities": ["NET_BIND_SERVICE"]}})
    localhost = {"type": "Localhost", "localhostProfile": "profiles/agentkv.json"}
    docs = _docs({"podSecurityContext": {"seccompProfile": localhost,
                                         "fsGroupChangePolicy": "OnRootMismatch",
                                         "seLinuxOptions": {"type": "container_t"},
                                         "sysctls": [{"name": "net.ipv4.tcp_keepalive_time",
                                                      "value": "60"}]}})
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    context = cluster["spec"]["headGroupSpec"]["template"]["spec"]["securityContext"]
    assert context["seccompProfile"] == localhost and context["runAsNonRoot"] is True


# The restricted standard's volume types; the chart's own volumes must stay within them.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_every_pod_of_every_value_set_meets_the_restricted_standard(value_set):
    for name, template in chart.pod_templates(value_set).items():
        spec = template["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod.get("runAsUser", 1) != 0, name
        assert pod["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost"), name
        for v in spec["volumes"]:
            assert set(v) - {"name"} <= RESTRICTED_VOLUMES, (name, v["name"])
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged"), name
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert set(sc["capabilities"].get("add", [])) <= {"NET_BIND_SERVICE"}, name
            assert sc.get("runAsUser", 1) != 0 and "seccompProfile" not in sc, name


# -- the external Redis URL, checked in the head pod before the service starts ------------

CA_URL = "rediss://agentkv:pw@redis.example:6380/0?ssl_ca_certs=/etc/agentkv/redis-ca/ca.crt"
URL_CASES = [  # (values, URL, the words its refusal must contain, or None: accepted)
    ({"caSecret": {"name": "agentkv-redis-ca"}}, CA_URL, None),
    ({"caSecret": {"name": "agentkv-redis-ca"}}, CA_URL + "&socket_timeout=5", None),
    ({"caSecret": {"name": "agentkv-redis-ca"}}, CA_URL.replace("rediss", "redis", 1),
     "redis.external.tls.enabled"),
    ({"caSecret": {"name": "agentkv-redis-ca"}}, CA_URL + "&ssl_cert_reqs=none",
     "ssl_cert_reqs"),
    ({"caSecret": {"name": "agentkv-redis-ca"}}, CA_URL + "&ssl_cert_reqs=optional&x=1",
     "ssl_cert_reqs"),
    ({"caSecret": {"name": "agentkv-redis-ca"}}, CA_URL + "&ssl_check_hostname=False",
     "ssl_check_hostname"),
    ({"caSecret": {"name": "agentkv-redis-ca"}}, "rediss://agentkv:pw@redis.example:6380/0",
     "ssl_ca_certs=/etc/agentkv/redis-ca/ca.crt"),
    ({"caSecret": {"name": "agentkv-redis-ca", "key": "bundle.pem"}}, CA_URL,
     "ssl_ca_certs=/etc/agentkv/redis-ca/bundle.pem"),
    ({"tls": {"systemCAs": True}}, "rediss://agentkv:pw@redis.example:6380/0", None),
    ({"tls": {"systemCAs": True}}, "rediss://agentkv:pw@r:6380/0?ssl_cert_reqs=none",
     "ssl_cert_reqs"),
    ({"tls": {"enabled": False}}, "redis://agentkv:pw@redis.example:6379/0", None),
    ({"tls": {"enabled": False}}, "rediss://agentkv:pw@redis.example:6380/0",
     "redis.external.tls.enabled"),
]


def _url_check(external: dict) -> dict:
    (cluster,) = [d for d in _docs(_external(**external)) if d["kind"] == "RayCluster"]
    (check,) = cluster["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"]
    return check


@pytest.mark.parametrize("external,url,refusal", URL_CASES,
                         ids=[f"{i}-{'ok' if c[2] is None else 'refused'}"
                              for i, c in enumerate(URL_CASES)])
def test_the_head_refuses_a_url_that_disagrees_with_the_values(external, url, refusal):
    check = _url_check(external)
    assert check["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "agentkv-redis-url",
                                                            "key": "url"}
    run = subprocess.run([*check["command"], *check["args"]], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "AGENTKV_DIRECTORY_REDIS_URL": url},
                         timeout=30, check=False)
    if refusal is None:
        assert run.returncode == 0 and run.stderr == "", run.stderr
    else:
        assert run.returncode == 1, run.stderr
        assert refusal in run.stderr and "Secret agentkv-redis-url" in run.stderr, run.stderr
        assert ":pw@" not in run.stderr  # the password never reaches the pod's log


def test_only_an_external_redis_gets_the_url_check():
    for value_set in ("default", "production-8gpu-4node", "cpu-demo"):
        assert "initContainers" not in chart.pod_templates(value_set)["head"]["spec"]
    assert chart.pod_templates("external-redis-tls")["head"]["spec"]["initContainers"]
