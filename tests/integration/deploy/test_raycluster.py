"""The RayCluster against the KubeRay CRD schema, and through Ray's own KubeRay parser."""

from __future__ import annotations

import copy
import functools
import json
import re

import jsonschema
import pytest
import yaml

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

CRD_FILE = "ray.io_rayclusters.yaml"


def _close(schema):
    """Reject unknown fields like `kubectl apply --validate=strict` (the API server's
    structural schemas would silently prune them)."""
    if isinstance(schema, dict):
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        for value in schema.values():
            _close(value)
    elif isinstance(schema, list):
        for value in schema:
            _close(value)
    return schema


@functools.lru_cache(maxsize=1)
def _validator(path: str) -> jsonschema.Draft7Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 0.4 s instead of 9 s
    with open(path) as f:
        crd = yaml.load(f, Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return jsonschema.Draft7Validator(_close(version["schema"]["openAPIV3Schema"]))


@pytest.fixture(scope="module")
def crd(shared_dir):
    path = shared_dir / "schemas" / CRD_FILE
    if not path.is_file():
        pytest.skip(f"KubeRay CRD schema {path} is absent (it lives in ../shared/schemas)")
    return _validator(str(path))


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_raycluster_matches_the_kuberay_crd(crd, value_set):
    errors = [f"{'/'.join(map(str, e.path))}: {e.message[:200]}"
              for e in crd.iter_errors(chart.raycluster(value_set))]
    assert errors == []


def test_crd_validation_catches_a_misplaced_field(crd):
    """Control: a GPU count put where KubeRay does not read it is an error."""
    rc = copy.deepcopy(chart.raycluster("default"))
    rc["spec"]["workerGroupSpecs"][0]["numGpus"] = 1
    rc["spec"]["workerGroupSpecs"][0].pop("groupName")
    messages = [e.message for e in crd.iter_errors(rc)]
    assert any("numGpus" in m for m in messages) and any("groupName" in m for m in messages)


@functools.cache
def _node_types(value_set: str) -> dict:
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    rc = copy.deepcopy(chart.raycluster(value_set))
    rc["metadata"]["namespace"] = chart.NAMESPACE  # the API server fills this in
    config = _derive_autoscaling_config_from_ray_cr(rc)  # also runs Ray's validate_config
    return {name: (t["resources"], t["min_workers"], t["max_workers"])
            for name, t in config["available_node_types"].items()}


GiB = 1 << 30
EXPECTED = {
    # value set -> Ray node type -> (resources, min workers, max workers)
    "default": {
        "headgroup": ({"CPU": 2, "GPU": 0, "memory": 8 * GiB}, 0, 0),
        "hbm-gpu": ({"CPU": 8, "GPU": 1, "memory": 64 * GiB}, 1, 1),
    },
    "cpu-demo": {
        "headgroup": ({"CPU": 2, "GPU": 0, "memory": 3 * GiB, "akv_pool": 1, "hbm_slot": 2},
                      0, 0),
    },
    "production-8gpu-4node": {
        "headgroup": ({"CPU": 4, "GPU": 0, "memory": 16 * GiB}, 0, 0),
        "hbm-gpu": ({"CPU": 96, "GPU": 8, "memory": 512 * GiB}, 4, 4),
    },
    "external-redis-tls": {
        "headgroup": ({"CPU": 2, "GPU": 0, "memory": 8 * GiB}, 0, 0),
        "hbm-gpu": ({"CPU": 16, "GPU": 2, "memory": 96 * GiB}, 2, 2),
    },
}


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_ray_parses_the_intended_resources(value_set):
    assert _node_types(value_set) == EXPECTED[value_set]


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_one_hbm_actor_per_gpu_the_device_plugin_grants(value_set):
    """Ray's GPU count (one HBM page actor each) equals what Kubernetes schedules."""
    values = chart.load_values(value_set) or {}
    resource = values.get("gpuWorkers", {}).get("gpuResourceName", "nvidia.com/gpu")
    for group in chart.raycluster(value_set)["spec"]["workerGroupSpecs"]:
        ray_gpus = _node_types(value_set)[group["groupName"]][0]["GPU"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        requests = group["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert int(limits[resource]) == int(requests[resource]) == ray_gpus >= 1


def test_production_totals():
    types = _node_types("production-8gpu-4node")
    resources, workers, _ = types["hbm-gpu"]
    assert resources["GPU"] * workers == 32  # 8 GPUs x 4 nodes = 32 HBM page actors


def _pool_resources(value_set: str) -> dict:
    """The pool pods' `ray start --resources`, parsed by Ray's KubeRay parser."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _get_custom_resources

    sts = chart.one(value_set, "StatefulSet", "-pool")
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"][0]
    raw = re.search(r"--resources='([^']*)'", args).group(1)
    as_kuberay_param = '"' + raw.replace('"', '\\"') + '"'  # rayStartParams form
    return _get_custom_resources({}, {"resources": as_kuberay_param}, "pool")


@pytest.mark.parametrize("value_set", ["default", "production-8gpu-4node", "external-redis-tls"])
def test_pool_pods_advertise_the_pool_resource(value_set):
    assert _pool_resources(value_set) == {"akv_pool": 1}
    args = chart.one(value_set, "StatefulSet", "-pool")["spec"]["template"]["spec"][
        "containers"][0]["args"][0]
    assert "--num-gpus=0" in args
    assert f"--address={chart.RELEASE}-head-svc.{chart.NAMESPACE}.svc.cluster.local:6379" in args


def test_custom_resource_string_is_json_for_ray():
    rc = chart.raycluster("cpu-demo")
    raw = rc["spec"]["headGroupSpec"]["rayStartParams"]["resources"]
    assert json.loads(raw[1:-1].replace("\\", "")) == {"akv_pool": 1, "hbm_slot": 2}


def test_ray_auth_modes(crd):
    """Token auth reaches every Ray process; `disabled` is explicit everywhere too."""
    rc = chart.raycluster("default")
    assert rc["spec"]["authOptions"] == {"mode": "token", "secretName": "agentkv-ray-auth"}
    docs = chart.render_values({"ray": {"auth": {"mode": "disabled"}}})
    disabled = next(d for d in yaml.safe_load_all(docs["agentkv/templates/raycluster.yaml"]))
    assert list(crd.iter_errors(disabled)) == []
    assert disabled["spec"]["authOptions"] == {"mode": "disabled"}
    head = disabled["spec"]["headGroupSpec"]["template"]
    env = {e["name"]: e for e in chart.container(head, "agentkv")["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "disabled" and "RAY_AUTH_TOKEN" not in env
    pool = chart.one("default", "StatefulSet", "-pool")["spec"]["template"]
    env = {e["name"]: e for e in pool["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "agentkv-ray-auth", "key": "auth_token"}
