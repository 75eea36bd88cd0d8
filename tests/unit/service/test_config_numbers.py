"""Numeric settings: every number must be finite and in range, and a full page must fit a
wire frame; the error is one ConfigError naming the setting (no traceback, no later crash
in time.sleep(nan) or a store refused as `oversized`)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from agentkv_cluster.config import (
    FRAME_ENVELOPE_BYTES,
    AgentKvConfig,
    ConfigError,
    ControllerConfig,
    load_config,
    validate,
)


def _float_fields() -> list[str]:
    out = []
    for f in dataclasses.fields(AgentKvConfig):
        if f.name == "role":
            continue
        cls = f.default_factory  # type: ignore[misc]
        hints = typing.get_type_hints(cls)
        out += [f"{f.name}.{g.name}" for g in dataclasses.fields(cls)
                if float in (hints[g.name], *typing.get_args(hints[g.name]))]
    return out


FLOAT_FIELDS = _float_fields()


def test_the_float_settings_are_found() -> None:
    assert {"controller.tick_s", "api.read_timeout_s", "credits.max_wait_s",
            "directory.retry_max_s", "controller.hbm_budget_fraction"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_float_settings_reject_non_finite_values(field: str, raw: str) -> None:
    env = {"AGENTKV_" + field.replace(".", "_").upper(): raw}
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert info.value.field == field
    assert str(info.value).startswith(field + ": ")


def test_yaml_nan_is_rejected_too(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("controller:\n  tick_s: .nan\n")
    with pytest.raises(ConfigError, match=r"^controller\.tick_s: must be a finite number"):
        load_config(path, env={})


def test_validate_checks_a_tree_built_in_code() -> None:
    cfg = AgentKvConfig(controller=ControllerConfig(tick_s=float("nan")))
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert info.value.field == "controller.tick_s"


@pytest.mark.parametrize("raw", ["-4", "-1"])
def test_negative_cpu_count_is_rejected(raw: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env={"AGENTKV_RAY_NUM_CPUS": raw})
    assert info.value.field == "ray.num_cpus"
    assert str(info.value) == f"ray.num_cpus: must be >= 0, got {raw}"


def test_cpu_count_unset_or_positive_is_accepted() -> None:
    assert load_config(env={}).ray.num_cpus is None
    assert load_config(env={"AGENTKV_RAY_NUM_CPUS": "8"}).ray.num_cpus == 8


@pytest.mark.parametrize("env", [
    {"AGENTKV_HBM_PAGE_BYTES": "128MiB"},  # page above the default 64 MiB frame
    {"AGENTKV_HBM_PAGE_BYTES": "64MiB"},  # equal: the envelope does not fit beside it
    {"AGENTKV_API_MAX_FRAME_BYTES": "1MiB"},  # default 4 MiB page
])
def test_a_page_that_no_frame_can_carry_is_rejected(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(env=env)
    assert info.value.field == "hbm.page_bytes"
    assert "api.max_frame_bytes" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_page_plus_envelope_that_fits_is_accepted() -> None:
    page = 4 << 20
    cfg = load_config(env={"AGENTKV_HBM_PAGE_BYTES": str(page),
                           "AGENTKV_API_MAX_FRAME_BYTES": str(page + FRAME_ENVELOPE_BYTES)})
    assert cfg.hbm.page_bytes == page
    with pytest.raises(ConfigError):
        load_config(env={"AGENTKV_HBM_PAGE_BYTES": str(page),
                         "AGENTKV_API_MAX_FRAME_BYTES": str(page + FRAME_ENVELOPE_BYTES - 1)})
    # The documented maximum page with the default 64 MiB frame (and pool slots that hold it).
    assert load_config(env={"AGENTKV_HBM_PAGE_BYTES": "32MiB",
                            "AGENTKV_POOL_SLOT_BYTES": "32MiB"}).hbm.page_bytes == 32 << 20


def test_local_ray_cpus_follow_the_setting_and_zero_is_not_replaced() -> None:
    from agentkv_cluster.runtime.ray_start import LOCAL_RAY_CPUS, local_ray_args

    assert local_ray_args(load_config(env={}))["num_cpus"] == LOCAL_RAY_CPUS
    assert local_ray_args(load_config(env={"AGENTKV_RAY_NUM_CPUS": "2"}))["num_cpus"] == 2
    assert local_ray_args(load_config(env={"AGENTKV_RAY_NUM_CPUS": "0"}))["num_cpus"] == 0
