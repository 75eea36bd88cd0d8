"""A ref naming no size class (a negative one, as an unpacked
location of another kind could give) is ``SlotEmpty`` for every call: never another class's
page read, overwritten or freed by Python's negative indexing."""

from __future__ import annotations

import os
import uuid

import pytest

from store.host_pool import SlotEmpty
from store.slab_pool import SlabClass, SlabPool, SlabRef


@pytest.fixture
def slab():
    name = f"akv-slab-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    pool = SlabPool.create(
        name, [SlabClass(slot_bytes=4096, num_slots=1), SlabClass(slot_bytes=65536, num_slots=1)]
    )
    yield pool
    pool.close()
    pool.unlink()


@pytest.mark.parametrize("size_class", [-1, -2, 2])
def test_a_ref_outside_the_classes_touches_no_page(slab, size_class):
    big, small = slab.alloc(60000), slab.alloc(100)
    assert (big, small) == (SlabRef(1, 0), SlabRef(0, 0))
    slab.write(big, b"B" * 60000)
    slab.write(small, b"s" * 100)
    bad = SlabRef(size_class, 0)
    with pytest.raises(SlotEmpty, match="no size class"):
        slab.read(bad)
    with pytest.raises(SlotEmpty, match="no size class"):
        slab.write(bad, b"x" * 10)
    with pytest.raises(SlotEmpty, match="no size class"):
        slab.free(bad)
    assert slab.read(big) == b"B" * 60000
    assert slab.read(small) == b"s" * 100
