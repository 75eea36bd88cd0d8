"""``DirectoryBlinder.forget`` drops the cached blinding
secret of an erased tenant: a tenant created again under the name gets a new directory
namespace and new entry keys, unrelated to the erased tenant's (whose namespace the
erasure mark records, and which a directory restored from an old snapshot has erased
again). With the secret kept, the new tenant's entries landed in the erased namespace:
old entries became its hits, and a re-applied erasure deleted its live entries."""

from __future__ import annotations

import time

from security.blinding import DirectoryBlinder
from security.keyring import FileKeySource, TenantKeyring

DIGEST = bytes(range(32))


def test_a_tenant_created_again_after_erasure_gets_a_new_namespace(tmp_path) -> None:
    ring = TenantKeyring(FileKeySource(tmp_path / "keys"))
    ring.create_tenant("acme")
    blinder = DirectoryBlinder(ring)
    old_ns, old_key = blinder.namespace("acme"), blinder.directory_key("acme", DIGEST)
    ring.mark_erased("acme", time.time(), old_ns)
    ring.destroy_tenant("acme")
    blinder.forget("acme")
    ring.create_tenant("acme")  # a new tenant under the name
    assert ring.erased_directory_namespaces() == [("acme", old_ns)]
    assert blinder.namespace("acme") != old_ns
    assert blinder.directory_key("acme", DIGEST) != old_key
    assert blinder.namespace("acme") == DirectoryBlinder(ring).namespace("acme")  # as a fresh process
