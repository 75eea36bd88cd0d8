"""Pure parts of the vLLM connector: hint parsing and block identities (no engine)."""

from __future__ import annotations

import pytest

from agentkv_cluster.engines.vllm.blocks import EngineVersions, block_identity, chain_hashes
from agentkv_cluster.engines.vllm.config import ConnectorConfig, ConnectorConfigError
from agentkv_cluster.engines.vllm.hints import NO_HINTS, HintError, HintKind, parse_hints

V = EngineVersions(model_version="m", tokenizer_version="t", rope_config="r")


def test_no_hints_is_fine():
    assert parse_hints(None) is NO_HINTS
    assert parse_hints({"other_connector": {"x": 1}}) is NO_HINTS


def test_full_hints_parse():
    h = parse_hints({"agentkv": {"session": "agent-1", "token": "akv1.x.y", "publish": True,
                                 "events": [{"kind": "tool_start", "tool": "grep",
                                             "call_id": "c1", "expected_s": 2.5},
                                            {"kind": "task_end", "ok": False}]}})
    assert (h.session, h.token, h.publish) == ("agent-1", "akv1.x.y", True)
    assert [e.kind for e in h.events] == [HintKind.TOOL_START, HintKind.TASK_END]
    assert h.events[0].tool == "grep" and h.events[0].expected_s == 2.5


@pytest.mark.parametrize("raw, fragment", [
    ("nope", "must be an object"),
    ({"agentkv": []}, "must be an object"),
    ({"agentkv": {"sesion": "x"}}, "unknown hint fields"),
    ({"agentkv": {"session": ""}}, "session must match"),
    ({"agentkv": {"session": "a b"}}, "session must match"),
    ({"agentkv": {"session": "x", "token": 7}}, "token must be"),
    ({"agentkv": {"session": "x", "events": [{"kind": "explode"}]}}, "unknown event kind"),
    ({"agentkv": {"session": "x", "events": [{"kind": "tool_start"}]}}, "tool class"),
    ({"agentkv": {"session": "x", "events": [{"kind": "task_end", "tool": "x"}]}}, "does not take"),
    ({"agentkv": {"session": "x", "events": [{"kind": "tool_start", "tool": "g",
                                              "expected_s": -1}]}}, "expected_s"),
    ({"agentkv": {"events": [{"kind": "task_end"}]}}, "need the session"),
    ({"agentkv": {"session": "x", "events": [{}] * 17}}, "at most 16"),
    ({"agentkv": {"session": "x", "publish": "yes"}}, "publish must be a bool"),
    ({"agentkv": {"branch": "b1"}}, "branch needs the session"),
    ({"agentkv": {"session": "x", "branch": ""}}, "branch must match"),
    ({"agentkv": {"session": "x", "branch": 3}}, "branch must match"),
])
def test_bad_hints_name_the_problem(raw, fragment):
    with pytest.raises(HintError, match=fragment):
        parse_hints(raw)


def test_chain_hash_covers_every_earlier_token_and_the_salt():
    a = chain_hashes(list(range(64)), 16)
    b = chain_hashes([999] + list(range(1, 64)), 16)
    assert len(a) == 4 and a[0] != b[0] and all(x != y for x, y in zip(a, b))
    c = chain_hashes(list(range(48)) + [5] * 16, 16)
    assert a[:3] == c[:3] and a[3] != c[3]  # shared prefix, divergent last block
    assert chain_hashes(list(range(64)), 16, salt="lora-x") != a
    assert chain_hashes(list(range(70)), 16) == a  # the partial tail is not a block


def test_identity_pins_tenant_versions_and_position():
    h = chain_hashes(list(range(32)), 16)
    base = block_identity(V, namespace="acme", adapter="", chain=h[1], index=1, block_size=16)
    assert (base.start, base.end) == (16, 32)
    others = [
        block_identity(V, namespace="globex", adapter="", chain=h[1], index=1, block_size=16),
        block_identity(EngineVersions(model_version="m2", tokenizer_version="t",
                                      rope_config="r"),
                       namespace="acme", adapter="", chain=h[1], index=1, block_size=16),
        block_identity(EngineVersions(model_version="m", tokenizer_version="t",
                                      rope_config="r2"),
                       namespace="acme", adapter="", chain=h[1], index=1, block_size=16),
        block_identity(V, namespace="acme", adapter="lora", chain=h[1], index=1, block_size=16),
        block_identity(V, namespace="acme", adapter="", chain=h[0], index=1, block_size=16),
    ]
    assert len({base.digest(), *(o.digest() for o in others)}) == 6


def test_connector_config_refuses_unknown_keys():
    assert ConnectorConfig.from_extra({"backend": "embedded"}).strategy == "agentkv"
    with pytest.raises(ConnectorConfigError, match="unknown AgentKV connector settings"):
        ConnectorConfig.from_extra({"backnd": "embedded"})
    with pytest.raises(ConnectorConfigError, match="service_address"):
        ConnectorConfig.from_extra({"backend": "service"})
    with pytest.raises(ConnectorConfigError, match="backend must be"):
        ConnectorConfig.from_extra({"backend": "redis"})


SVC = {"backend": "service", "service_address": "h:1"}


@pytest.mark.parametrize(("extra", "says"), [
    ({"host_blocks": "10"}, "host_blocks must be int"),
    ({"min_tail_tokens": "16"}, "min_tail_tokens must be int"),
    ({**SVC, "service_timeout_s": "fast"}, "service_timeout_s must be float"),
    ({**SVC, "retry_after_s": None}, "retry_after_s must be float"),
    ({"host_blocks": True}, "host_blocks must be int"),
    ({"save_queue": 0}, "save_queue must be > 0"),
    ({"lookup_timeout_s": -1}, "lookup_timeout_s must be > 0"),
    ({"prefetch_lead_s": float("nan")}, "must be"),
    # found from outside: these passed, then every call failed (an infinite timeout is an
    # OverflowError), or the engine refused them after loading the model
    ({**SVC, "service_timeout_s": float("inf")}, "service_timeout_s must be > 0 and finite"),
    ({"lookup_timeout_s": float("inf")}, "lookup_timeout_s must be > 0 and finite"),
    ({**SVC, "retry_after_s": float("inf")}, "retry_after_s must be > 0 and finite"),
    ({"prefetch_lead_s": float("inf")}, "finite"),
    ({"strategy": "LRU"}, "strategy must be one of"),
    ({**SVC, "service_address": "localhost"}, "host:port, or a unix socket"),
    ({**SVC, "service_address": "127.0.0.1:99999"}, "port must be 1..65535"),
    ({"backend": "service", "service_address": "agentkv:0"}, "port must be 1..65535"),
    ({"agentkv": {"backend": "embedded"}, "bogus_key": 1}, "a map 'agentkv'"),
    ({"agentkv": "embedded"}, "a map 'agentkv'"),
    ({"agentkv": None}, "a map 'agentkv'"),
])
def test_connector_config_names_the_bad_setting(extra, says):
    """Each bad value names its setting (a string where an int goes used to stop the
    engine with a bare TypeError; keys beside a nested 'agentkv' map were dropped)."""
    with pytest.raises(ConnectorConfigError, match=says):
        ConnectorConfig.from_extra(extra)
    assert ConnectorConfig.from_extra({"agentkv": {**SVC, "service_timeout_s": 2}}).service_timeout_s == 2


@pytest.mark.parametrize(("extra", "says"), [
    ({"service_address": "10.0.0.5:7420"}, r"\['service_address'\] apply to the service backend"),
    ({"backend": "embedded", "service_timeout_s": 2.0, "retry_after_s": 1.0},
     r"\['retry_after_s', 'service_timeout_s'\] apply to the service"),
    ({**SVC, "nvme_dir": "/data/kv"}, r"\['nvme_dir'\] apply to the embedded backend"),
    ({**SVC, "host_blocks": 64, "strategy": "lru"}, "this engine uses the service one"),
    ({**SVC, "token_secret_file": "/etc/secret"}, "token_secret_file"),
])
def test_settings_of_the_other_backend_are_refused(extra, says):
    """A setting only the other backend reads was silently unused (an engine meant for
    the service ran on the embedded store with a service_address it never dialled)."""
    with pytest.raises(ConnectorConfigError, match=says):
        ConnectorConfig.from_extra(extra)
    both = {"lookup_timeout_s": 1.0, "save_queue": 8, "min_tail_tokens": 0}
    assert ConnectorConfig.from_extra({**SVC, **both}).save_queue == 8
    assert ConnectorConfig.from_extra({"backend": "embedded", **both}).save_queue == 8


@pytest.mark.parametrize("tenant", ["_public", "../x", "Acme", ""])
def test_default_tenant_must_be_a_tenant_never_public(tenant):
    """Token-less requests act as ``default_tenant``: the PUBLIC namespace there let them
    write PUBLIC without the publish role, and any public_read tenant restore it."""
    with pytest.raises(ConnectorConfigError, match="default_tenant"):
        ConnectorConfig.from_extra({"backend": "embedded", "default_tenant": tenant})
    assert ConnectorConfig.from_extra({"default_tenant": None}).default_tenant is None


def test_a_request_names_its_branch():
    h = parse_hints({"agentkv": {"session": "agent-1", "branch": "try-2"}})
    assert (h.session, h.branch) == ("agent-1", "try-2")
    assert parse_hints({"agentkv": {"session": "agent-1"}}).branch == ""


def test_an_unreadable_token_secret_file_names_the_setting(tmp_path):
    cfg = ConnectorConfig.from_extra({"token_secret_file": str(tmp_path / "missing")})
    with pytest.raises(ConnectorConfigError, match="token_secret_file .*missing"):
        cfg.token_secret()  # a bare FileNotFoundError stopped the engine before
    good = ConnectorConfig.from_extra({**SVC, "service_address": "/run/agentkv.sock"})
    assert good.address() == "/run/agentkv.sock"
    assert ConnectorConfig.from_extra({**SVC, "service_address": ":9420"}).address() == \
        ("127.0.0.1", 9420)
