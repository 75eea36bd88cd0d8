"""Bytes and where they are: page format, codecs, tiers, transport, directory.

Nothing here decides policy, and nothing here imports ``agentkv_cluster``.
Submodules are imported explicitly (``from store.host_pool import HostPool``)
so that importing ``store.types`` stays free of torch, NIXL and Redis.
"""
