"""Quality of compressed KV restores on the real model (teacher-forced, vs full precision).

Windows of 512 context + 256 continuation tokens of real text; agreement, KL and
perplexity are averaged over up to four disjoint windows (one window has only 256
positions: one flipped near-tie moves top-1 by 0.004).
"""

from __future__ import annotations

import pytest

from agentkv_cluster.engines.hf import AdapterConfig, HfKVAdapter
from agentkv_cluster.engines.quality import measure_windows
from store.codecs import CodecSpec
from tests.slow.engines.conftest import PAGE_TOKENS, make_store

pytestmark = pytest.mark.slow

SPECS = (CodecSpec.int8(), CodecSpec.int4(), CodecSpec.int4("token"), CodecSpec.int2())


@pytest.fixture(scope="module")
def rows(loaded, doc_ids):
    store = make_store(loaded)
    try:
        adapter = HfKVAdapter(loaded, store, AdapterConfig(page_tokens=PAGE_TOKENS))
        return {row.label: row for row in measure_windows(adapter, loaded.model, doc_ids, SPECS)}
    finally:
        store.close()


def test_int8_restore_is_nearly_lossless(rows):
    row = rows["int8"]
    assert row.windows >= 1
    assert row.top1 >= 0.99
    assert row.kl <= 1e-3
    assert abs(row.ppl_change) <= 0.005


def test_int4_kivi_meets_bounds_and_beats_per_token_keys(rows):
    kivi, per_token = rows["int4-kivi"], rows["int4-tok"]
    assert kivi.top1 >= 0.93
    assert kivi.kl <= 0.02
    assert abs(kivi.ppl_change) <= 0.03
    assert kivi.kl < per_token.kl
    assert kivi.bytes_ratio < rows["int8"].bytes_ratio


def test_int2_is_reported_lossy(rows):
    int2 = rows["int2-kivi"]
    assert not int2.lossless
    # Far outside the INT4 quality bar: it may only serve as a verified draft.
    assert int2.kl > 0.02 and int2.top1 < 0.93


def test_forms_that_share_a_label_get_a_row_each(loaded, doc_ids):
    """INT4 at group 32 and at group 64 are both 'int4-kivi': two rows, one window each,
    each with its own bytes, not one row pooling both (a form listed twice counts once)."""
    store = make_store(loaded)
    try:
        adapter = HfKVAdapter(loaded, store, AdapterConfig(page_tokens=PAGE_TOKENS))
        specs = (CodecSpec.int4(group_size=32), CodecSpec.int4(group_size=64),
                 CodecSpec.int8(), CodecSpec.int8())
        rows = {row.label: row for row in measure_windows(
            adapter, loaded.model, doc_ids, specs, context=64, continuation=16, max_windows=1)}
    finally:
        store.close()
    assert set(rows) == {"int4-kivi-g32", "int4-kivi-g64", "int8"}
    assert all(row.windows == 1 for row in rows.values())
    assert rows["int4-kivi-g32"].bytes_ratio < rows["int8"].bytes_ratio < 1
    assert rows["int4-kivi-g32"].bytes_ratio != rows["int4-kivi-g64"].bytes_ratio
