"""The generated ACL rules (the live-server behaviour is in tests/integration/security)."""

from __future__ import annotations

import pytest

from security.errors import InvalidName
from security.redis_acl import DENIED_COMMANDS, acl_file_line, acl_rules, make_user


def test_rules_restrict_to_the_prefix_and_deny_introspection():
    user = make_user("n0123456789abcdef01234567", password="pw")
    rules = acl_rules(user)
    assert rules[:2] == ["reset", "on"] and "~akv:{n0123456789abcdef01234567}:*" in rules
    assert "resetchannels" in rules and "-@all" in rules and "nopass" not in rules
    assert not any(r.startswith(">") for r in rules)  # only the SHA-256 of the password
    required = {"scan", "keys", "dbsize", "info", "slowlog", "client", "monitor", "config",
                "debug", "object"}
    assert required <= set(DENIED_COMMANDS)
    denies = rules[rules.index("-@dangerous") + 1:]
    assert denies == [f"-{c}" for c in DENIED_COMMANDS]  # denials come last, so they win
    line = acl_file_line(user)
    assert line.startswith("user akv-n0123456789abcdef01234567 on #") and " reset " not in line


@pytest.mark.parametrize("ns", ["", "A", "a b", "a*", "x" * 65, "a:b"])
def test_bad_namespaces_are_refused(ns):
    with pytest.raises(InvalidName):
        make_user(ns)


def test_passwords_are_random():
    assert make_user("ns").password != make_user("ns").password
    assert len(make_user("ns").password) >= 40
