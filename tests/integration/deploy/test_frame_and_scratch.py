"""The chart and the service agree on what fits: every page size the chart accepts fits one
wire frame with its request envelope (or `agentkv serve` would refuse the rendered config),
and a pool hosted on the head or a GPU worker gets an NVMe emptyDir that holds its shard."""

from __future__ import annotations

import json

import helm_python as helm
import pytest
import yaml

from agentkv_cluster.config import FRAME_ENVELOPE_BYTES, ConfigError, load_config
from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

SCHEMA = json.loads((chart.CHART / "values.schema.json").read_text())
PAGE_SIZES = SCHEMA["properties"]["service"]["properties"]["pageBytes"]["enum"]
BIG_MEMORY = {"resources": {"requests": {"memory": "32Gi"}, "limits": {"memory": "32Gi"}}}


def _docs(values: dict) -> list[dict]:
    return [d for path, text in chart.render_values(values).items()
            if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]


def _service_config(values: dict, tmp_path):
    (cm,) = [d for d in _docs(values) if d["kind"] == "ConfigMap"
             and d["metadata"]["name"].endswith("-config")]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    return load_config(path, env={})


@pytest.mark.parametrize("page", PAGE_SIZES)
def test_every_page_size_the_chart_accepts_fits_the_default_frame(page, tmp_path):
    frame = chart.merged_values("default")["service"]["maxFrameBytes"]
    assert page + FRAME_ENVELOPE_BYTES <= frame
    cfg = _service_config({"service": {"pageBytes": page}}, tmp_path)
    assert cfg.hbm.page_bytes == page and cfg.api.max_frame_bytes == frame


def test_the_chart_refuses_what_the_service_would_refuse(tmp_path):
    """Just below the fit the chart fails at render; at the fit both accept."""
    page = 8 << 20
    fit = page + FRAME_ENVELOPE_BYTES
    with pytest.raises(helm.HelmRenderError, match=r"at '/service/pageBytes'.*service\.maxFrameBytes"):
        chart.render_values({"service": {"pageBytes": page, "maxFrameBytes": fit - 1}})
    with pytest.raises(ConfigError, match=r"api\.max_frame_bytes"):
        load_config(env={"AGENTKV_HBM_PAGE_BYTES": str(page),
                         "AGENTKV_API_MAX_FRAME_BYTES": str(fit - 1)})
    cfg = _service_config({"service": {"pageBytes": page, "maxFrameBytes": fit}}, tmp_path)
    assert cfg.api.max_frame_bytes == fit


@pytest.mark.parametrize("page", PAGE_SIZES)
def test_an_nvme_quota_the_chart_accepts_holds_a_page_the_service_accepts(page, tmp_path):
    """Below page + 8 KiB the chart fails at render, naming pool.nvme.bytes; at it the
    service takes the rendered config (it needs the page's sealed record and header)."""
    with pytest.raises(helm.HelmRenderError, match=r"at '/pool/nvme/bytes'.*service\.pageBytes"):
        chart.render_values({"service": {"pageBytes": page},
                             "pool": {"nvme": {"bytes": page + 8191}}})
    cfg = _service_config({"service": {"pageBytes": page},
                           "pool": {"nvme": {"bytes": page + 8192}}}, tmp_path)
    assert cfg.pool.nvme_bytes == page + 8192
    with pytest.raises(ConfigError, match=r"pool\.nvme_bytes"):  # the service's own floor
        load_config(env={"AGENTKV_HBM_PAGE_BYTES": str(page),
                         "AGENTKV_POOL_SLOT_BYTES": str(page),
                         "AGENTKV_POOL_NVME_BYTES": str(page)})


def _nvme_limits(values: dict) -> dict[str, int]:
    (rc,) = [d for d in _docs(values) if d["kind"] == "RayCluster"]
    templates = {"head": rc["spec"]["headGroupSpec"]["template"]}
    templates |= {g["groupName"]: g["template"] for g in rc["spec"]["workerGroupSpecs"]}
    return {name: chart.quantity_bytes(chart.volume(t, "nvme")["emptyDir"]["sizeLimit"])
            for name, t in templates.items()}


@pytest.mark.parametrize("group,pod,extra", [("head", "head", BIG_MEMORY),
                                             ("gpuWorkers", "hbm-gpu", {})])
def test_a_hosted_pool_renders_only_with_room_for_its_shard(group, pod, extra):
    shard = 20 << 30
    values = {"pool": {"nvme": {"bytes": shard}}, group: {"hostPool": True, **extra}}
    with pytest.raises(helm.HelmRenderError, match=rf"at '/{group}/scratchBytes'.*pool\.nvme\.bytes"):
        chart.render_values(values)
    values[group]["scratchBytes"] = shard  # exactly the quota: no room for compaction
    with pytest.raises(helm.HelmRenderError, match=r"compaction's copies and tombstones"):
        chart.render_values(values)
    values[group]["scratchBytes"] = shard + (256 << 20) + shard // 64
    assert _nvme_limits(values)[pod] >= shard + (256 << 20) + shard // 64


def test_the_pool_volume_holds_the_shard_quota_and_compaction_room():
    shard = 20 << 30
    (sts,) = [d for d in _docs({"pool": {"nvme": {"bytes": shard}}})
              if d["kind"] == "StatefulSet" and "pool" in d["metadata"]["name"]]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    asked = chart.quantity_bytes(claim["spec"]["resources"]["requests"]["storage"])
    assert asked >= shard + (256 << 20) + shard // 64


@pytest.mark.parametrize("tombstones", [0, 32, 65536])
def test_the_space_reserve_reaches_the_service(tombstones, tmp_path):
    """``pool.nvme.reserveTombstones`` becomes each shard's reserve (8 KiB a tombstone, in
    its LOCK file). It is taken from the volume's room past the quota (which tombstones and
    compaction's copies, the reserve's only users, would take anyway), so the volume
    claim, immutable after install, does not change with it."""
    shard = 20 << 30
    values = {"pool": {"nvme": {"bytes": shard, "reserveTombstones": tombstones}}}
    assert _service_config(values, tmp_path).pool.nvme_reserve_tombstones == tombstones
    assert _claims(values) == _claims({"pool": {"nvme": {"bytes": shard}}})


def _claims(values: dict) -> list:
    return [d["spec"]["volumeClaimTemplates"] for d in _docs(values)
            if d["kind"] == "StatefulSet" and "pool" in d["metadata"]["name"]]


@pytest.mark.parametrize("bad", [-1, 65537, "32"])
def test_a_space_reserve_out_of_range_is_refused_at_render(bad):
    with pytest.raises(helm.HelmValuesError, match="/pool/nvme/reserveTombstones"):
        chart.render_values({"pool": {"nvme": {"reserveTombstones": bad}}})


def test_a_pod_without_a_pool_keeps_its_small_scratch():
    """No pool on the head or GPU workers: their emptyDir is scratch, not held to the quota."""
    limits = _nvme_limits({"pool": {"nvme": {"bytes": 1 << 40}}})
    assert all(limit < 1 << 40 for limit in limits.values())
