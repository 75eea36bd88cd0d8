"""Extra volumes, mounts and env that cannot work in their pod are refused at render.

A volume named like one of the chart's, a second mount at a path the chart mounts, or a
mount of a volume the pod lacks rendered as given: the API server refused the pool and
Redis StatefulSets at install, but took the RayCluster, whose head and GPU worker pods
KubeRay then failed to create, so the cluster never started. Env names Kubernetes refuses,
and a name the list sets twice (only the later value reaches the container), rendered too.
"""

from __future__ import annotations

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.integration.deploy import chart
from tests.integration.deploy import test_raycluster as rc
from tests.integration.deploy.test_render import KUBE_VERSIONS

pytestmark = pytest.mark.integration

SCRATCH = {"name": "scratch", "emptyDir": {}}
MODELS = {"name": "models", "persistentVolumeClaim": {"claimName": "models"}}


def _vol(name: str) -> dict:
    return {"name": name, "emptyDir": {}}


def _mount(name: str, path: str) -> dict:
    return {"name": name, "mountPath": path}


def _redis(**extra) -> dict:
    return {"redis": {"bundled": extra}}


# (case, values, the field path the error must name, words the message must hold)
CASES = [
    # Volume names the chart's own pods already use (or their volume claim templates).
    ("head volume named tmp", {"head": {"extraVolumes": [_vol("tmp")]}},
     "/head/extraVolumes/0/name", "already has a volume named tmp"),
    ("head volume named config after a good one",
     {"head": {"extraVolumes": [SCRATCH, _vol("config")]}}, "/head/extraVolumes/1/name",
     "head.extraVolumeMounts"),
    ("GPU worker volume named like its /dev/shm", {"gpuWorkers": {"extraVolumes": [_vol("dshm")]}},
     "/gpuWorkers/extraVolumes/0/name", "dshm"),
    ("pool volume named like its NVMe claim", {"pool": {"extraVolumes": [_vol("nvme")]}},
     "/pool/extraVolumes/0/name", "nvme"),
    ("pool volume named like the tenant keys", {"pool": {"extraVolumes": [_vol("tenant-keys")]}},
     "/pool/extraVolumes/0/name", "tenant-keys"),
    ("Redis volume named like its config", _redis(extraVolumes=[_vol("conf")]),
     "/redis/bundled/extraVolumes/0/name", "conf"),
    ("Redis volume named like its data claim", _redis(extraVolumes=[_vol("data")]),
     "/redis/bundled/extraVolumes/0/name", "data"),
    ("Redis volume named like a tenant user's password",
     _redis(tenantUsers=[{"username": "akv-a", "namespace": "a",
                          "passwordSecret": {"name": "s", "key": "p"}}],
            extraVolumes=[_vol("tenant-0-password")]),
     "/redis/bundled/extraVolumes/0/name", "tenant-0-password"),
    ("one extra volume name twice", {"head": {"extraVolumes": [SCRATCH, SCRATCH]}},
     "/head/extraVolumes/1/name", "head.extraVolumes[0]"),
    ("volume name Kubernetes refuses", {"pool": {"extraVolumes": [_vol("Models_A")]}},
     "/pool/extraVolumes/0/name", "DNS label"),
    # Mounts at a path the chart mounts in a container the extra mounts go to.
    ("head mount at /dev/shm",
     {"head": {"extraVolumes": [SCRATCH], "extraVolumeMounts": [_mount("scratch", "/dev/shm")]}},
     "/head/extraVolumeMounts/0/mountPath", "dshm"),
    ("head mount at the agentkv container's token",
     {"head": {"extraVolumes": [SCRATCH],
               "extraVolumeMounts": [_mount("scratch", "/etc/agentkv/token")]}},
     "/head/extraVolumeMounts/0/mountPath", "token-secret"),
    ("head mount at /tmp/ (the same path)",
     {"head": {"extraVolumes": [SCRATCH], "extraVolumeMounts": [_mount("scratch", "/tmp/")]}},
     "/head/extraVolumeMounts/0/mountPath", "at /tmp"),
    ("GPU worker mount of the chart's tmp at the NVMe path",
     {"gpuWorkers": {"extraVolumeMounts": [_mount("tmp", "/var/lib/agentkv/nvme")]}},
     "/gpuWorkers/extraVolumeMounts/0/mountPath", "nvme"),
    ("pool mount at /tmp",
     {"pool": {"extraVolumes": [SCRATCH], "extraVolumeMounts": [_mount("scratch", "/tmp")]}},
     "/pool/extraVolumeMounts/0/mountPath", "tmp"),
    ("Redis mount at /data",
     _redis(extraVolumes=[SCRATCH], extraVolumeMounts=[_mount("scratch", "/data")]),
     "/redis/bundled/extraVolumeMounts/0/mountPath", "data"),
    ("two extra mounts at one path",
     {"pool": {"extraVolumes": [SCRATCH, MODELS],
               "extraVolumeMounts": [_mount("scratch", "/x"), _mount("models", "/x/")]}},
     "/pool/extraVolumeMounts/1/mountPath", "pool.extraVolumeMounts[0]"),
    ("relative mount path",
     {"pool": {"extraVolumes": [SCRATCH], "extraVolumeMounts": [_mount("scratch", "data")]}},
     "/pool/extraVolumeMounts/0/mountPath", "absolute"),
    # Mounts of a volume the pod does not have.
    ("GPU worker mount of no volume", {"gpuWorkers": {"extraVolumeMounts": [_mount("nope", "/d")]}},
     "/gpuWorkers/extraVolumeMounts/0/name", "gpuWorkers.extraVolumes"),
    ("head mount of a GPU worker's extra volume",
     {"gpuWorkers": {"extraVolumes": [MODELS]},
      "head": {"extraVolumeMounts": [_mount("models", "/models")]}},
     "/head/extraVolumeMounts/0/name", "no volume named"),
    ("head mount of the Redis data claim", {"head": {"extraVolumeMounts": [_mount("data", "/d")]}},
     "/head/extraVolumeMounts/0/name", "no volume named"),
    ("Redis mount of no volume", _redis(extraVolumeMounts=[_mount("models", "/models")]),
     "/redis/bundled/extraVolumeMounts/0/name", "redis.bundled.extraVolumes"),
    # Env names.
    ("env name starting with a digit", {"head": {"extraEnv": [{"name": "1X", "value": "a"}]}},
     "/head/extraEnv/0/name", "not an environment variable name"),
    ("env name with a space",
     {"gpuWorkers": {"extraEnv": [{"name": "NCCL_DEBUG", "value": "INFO"},
                                  {"name": "NCCL DEBUG", "value": "INFO"}]}},
     "/gpuWorkers/extraEnv/1/name", "not an environment variable name"),
    ("env entry without a name", {"pool": {"extraEnv": [{"value": "a"}]}},
     "/pool/extraEnv/0/name", "pool.extraEnv[0].name"),
    ("env name twice in the list",
     {"pool": {"extraEnv": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"},
                            {"name": "A", "value": "3"}]}},
     "/pool/extraEnv/2/name", "pool.extraEnv[0] already sets A"),
    ("Redis env name twice in the list",
     _redis(extraEnv=[{"name": "TZ", "value": "UTC"}, {"name": "TZ", "value": "CET"}]),
     "/redis/bundled/extraEnv/1/name", "redis.bundled.extraEnv[0]"),
]


@pytest.mark.parametrize("case,values,field,words", CASES, ids=[c[0] for c in CASES])
def test_extras_that_cannot_work_are_refused_naming_the_value(case, values, field, words):
    with pytest.raises(helm.HelmRenderError) as info:
        chart.render_values(values)
    message = str(info.value)
    assert f"values: at '{field}': " in message, message
    assert words in message, message


# Extras that do work: a new volume in every pod, mounts below the chart's paths, a mount of
# one of the chart's own volumes at another path, and an env that overrides the chart's.
GOOD = {
    "head": {"extraVolumes": [SCRATCH, MODELS],
             "extraVolumeMounts": [_mount("scratch", "/tmp/extra"),
                                   {**_mount("models", "/models"), "readOnly": True},
                                   {**_mount("config", "/etc/agentkv-copy/config.yaml"),
                                    "subPath": "config.yaml"}],
             "extraEnv": [{"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
                          {"name": "my.setting-1", "value": "x"}]},
    "gpuWorkers": {"extraVolumes": [MODELS], "extraVolumeMounts": [_mount("models", "/models")],
                   "extraEnv": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
    "pool": {"extraVolumes": [SCRATCH], "extraVolumeMounts": [_mount("scratch", "/scratch"),
                                                               _mount("nvme", "/nvme-copy")],
             "extraEnv": [{"name": "_UNDERSCORE", "value": "1"}]},
    "redis": {"bundled": {"extraVolumes": [SCRATCH],
                          "extraVolumeMounts": [_mount("scratch", "/data/extra")],
                          "extraEnv": [{"name": "TZ", "value": "UTC"}]}},
}


@pytest.fixture(scope="module")
def crd(shared_dir):
    path = shared_dir / "schemas" / rc.CRD_FILE
    if not path.is_file():
        pytest.skip(f"KubeRay CRD schema {path} is absent (it lives in ../shared/schemas)")
    return rc._validator(str(path))


def test_extras_that_fit_render_and_validate_strictly(crd):
    docs = [d for path, text in chart.render_values(GOOD).items()
            if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    assert [f"{'/'.join(map(str, e.path))}: {e.message[:200]}"
            for e in crd.iter_errors(cluster)] == []
    statefulsets = [d for d in docs if d["kind"] == "StatefulSet"]
    assert len(statefulsets) == 2
    for sts in statefulsets:
        kubernetes_validate.validate(sts, KUBE_VERSIONS[-1], strict=True)
    pods = {"head": cluster["spec"]["headGroupSpec"]["template"],
            "gpuWorkers": cluster["spec"]["workerGroupSpecs"][0]["template"]}
    pods.update({s["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]:
                 s["spec"]["template"] for s in statefulsets})
    groups = {**{k: GOOD[k] for k in ("head", "gpuWorkers", "pool")},
              "redis": GOOD["redis"]["bundled"]}
    for name, group in groups.items():
        spec = pods[name]["spec"]
        volumes = [v["name"] for v in spec["volumes"]]
        assert len(volumes) == len(set(volumes)), name
        assert volumes[-len(group["extraVolumes"]):] == [v["name"] for v in group["extraVolumes"]]
        for c in spec["containers"]:
            paths = [m["mountPath"] for m in c["volumeMounts"]]
            assert len(paths) == len(set(paths)), (name, c["name"])
            assert c["volumeMounts"][-len(group["extraVolumeMounts"]):] == \
                group["extraVolumeMounts"], (name, c["name"])
            assert c["env"][-len(group["extraEnv"]):] == group["extraEnv"], (name, c["name"])
    assert chart.lint(GOOD)["errors"] == []


def test_a_disabled_workers_extras_are_not_checked():
    """GPU workers that are off render no pod: their extras reach nothing."""
    values = {"gpuWorkers": {"enabled": False, "extraVolumes": [_vol("dshm")]},
              "head": {"hbmSlots": 1}}
    assert chart.render_values(values)
