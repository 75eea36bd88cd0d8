"""Which process a store handle belongs to.

A child made by ``os.fork`` inherits every handle of its parent: the writer locks
(``flock`` belongs to the open file, which parent and child now share), the descriptors,
the shared mappings and the in-memory indexes. None of it is the child's own: a write
through it takes the same host slot or NVMe offset as the parent's next write, and a read
goes by an index the parent keeps changing. So a handle notes the fork generation it was
opened in, and refuses use in another (``PoolForked``, ``ShardForked``, ``StoreForked``);
a child opens or attaches handles of its own.

A counter bumped in every child (``os.register_at_fork``) rather than ``os.getpid()``:
the check runs on every put and get, and a module global costs less than a system call.
"""

from __future__ import annotations

import os

_generation = 0


def _bump() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_bump)


def generation() -> int:
    """The fork generation of this process (a handle records it when opened)."""
    return _generation


def forked_since(opened: int) -> bool:
    """Whether this process is a fork child of the one that opened a handle at ``opened``."""
    return _generation != opened
