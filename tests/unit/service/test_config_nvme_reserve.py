"""``pool.nvme_reserve_tombstones``: the NVMe shards' space reserve, set from the service
configuration (YAML, ``AGENTKV_POOL_NVME_RESERVE_TOMBSTONES``, overrides) and checked at
load time against the shard's own limit. Before, the field did not exist: the loader
refused it as an unknown field and every pool ran with the shard's default."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentkv_cluster.config import ConfigError, PoolConfig, env_variables, load_config
from agentkv_cluster.config_sizes import size_conflicts
from store.nvme import NvmeShardConfig
from store.nvme.types import MAX_RESERVE_TOMBSTONES

FIELD = "pool.nvme_reserve_tombstones"
ENV = "AGENTKV_POOL_NVME_RESERVE_TOMBSTONES"
RANGE = ("must be a whole number of tombstones from 0 (no space reserve) to 65536 "
         "(8 KiB each: 512 MiB per NVMe shard)")


def test_the_default_is_the_shards_default():
    assert PoolConfig().nvme_reserve_tombstones == NvmeShardConfig().reserve_tombstones == 32
    assert load_config(env={}).pool.nvme_reserve_tombstones == 32


@pytest.mark.parametrize(("raw", "value"), [
    ("64", 64), ("0", 0), ("65536", MAX_RESERVE_TOMBSTONES), ("1_024", 1024), ("0x10", 16),
])
def test_the_environment_sets_it(raw, value):
    cfg = load_config(env={ENV: raw})
    assert cfg.pool.nvme_reserve_tombstones == value
    NvmeShardConfig(reserve_tombstones=value)  # every value the loader takes, the shard takes


@pytest.mark.parametrize(("raw", "says"), [
    ("-1", RANGE + ", got -1"), ("65537", RANGE + ", got 65537"),
    ("abc", "expected int, got 'abc'"), ("2.5", "expected int, got '2.5'"),
    ("", "expected int, got ''"),
])
def test_a_bad_value_names_the_field_and_the_range(raw, says):
    with pytest.raises(ConfigError) as bad:
        load_config(env={ENV: raw})
    assert bad.value.field == FIELD
    assert str(bad.value) == f"{FIELD}: {says}"


def test_a_yaml_file_sets_it_and_a_bad_one_is_refused(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text("pool:\n  nvme_reserve_tombstones: 256\n")
    assert load_config(good, env={}).pool.nvme_reserve_tombstones == 256
    for text, says in (("true", "expected int, got True"), ("-8", RANGE + ", got -8"),
                       ("2.5", "expected int, got 2.5")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"pool:\n  nvme_reserve_tombstones: {text}\n")
        with pytest.raises(ConfigError) as refused:
            load_config(bad, env={})
        assert str(refused.value) == f"{FIELD}: {says}"


@pytest.mark.parametrize(("value", "bound"), [(-1, 0), (MAX_RESERVE_TOMBSTONES + 1,
                                                        MAX_RESERVE_TOMBSTONES)])
def test_the_conflict_says_which_end_was_passed(value, bound):
    cfg = load_config(env={})
    bad = type(cfg)(**{**cfg.__dict__,
                       "pool": PoolConfig(nvme_reserve_tombstones=value)})
    [conflict] = [c for c in size_conflicts(bad) if c.field == FIELD]
    assert conflict.bound == bound
    with pytest.raises(ValueError, match="reserve_tombstones must be in"):
        NvmeShardConfig(reserve_tombstones=value)  # the shard refuses the same values


def test_serve_lists_the_variable_with_its_default():
    assert (ENV, "int", 32) in env_variables()
