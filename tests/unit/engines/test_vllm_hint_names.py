"""The name fields of the vLLM connector's hints (``branch``, ``tool``, ``call_id``) take
the session name's rule: a typed error naming the field for anything else (a newline, a
control character, a blank, an over-long string), and the request is then served without
AgentKV with that error in its response. They used to take any string of 1..128
characters, so a newline or an escape sequence went into log lines and service events."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agentkv_cluster.engines.vllm.hints import HintError, HintFieldError, parse_hints

BAD = ["a\nb", "tool\x1b[2J", "a b", "tab\there", "nul\x00", "", "é", "x" * 129]


def _tool_start(**fields):
    return {"agentkv": {"session": "s1", "events": [{"kind": "tool_start", "tool": "grep",
                                                     **fields}]}}


CASES = {
    "tool": lambda v: _tool_start(tool=v),
    "call_id": lambda v: _tool_start(call_id=v),
    "branch": lambda v: {"agentkv": {"session": "s1", "branch": v}},
}


@pytest.mark.parametrize("value", BAD, ids=repr)
@pytest.mark.parametrize("field", sorted(CASES))
def test_a_name_field_out_of_the_rule_is_a_typed_error_naming_it(field, value):
    with pytest.raises(HintFieldError, match=f"^{field} must match") as err:
        parse_hints(CASES[field](value))
    assert err.value.field == field and isinstance(err.value, HintError)
    assert value not in str(err.value) or value == ""  # never echoed


def test_an_abandoned_branch_and_an_observations_call_id_take_the_rule_too():
    for kind, field in (("branch_abandoned", "branch"), ("observation_return", "call_id"),
                        ("model_call", "call_id")):
        raw = {"agentkv": {"session": "s1", "events": [{"kind": kind, field: "x\ny"}]}}
        with pytest.raises(HintFieldError) as err:
            parse_hints(raw)
        assert err.value.field == field


def test_a_session_name_out_of_the_rule_names_the_session():
    with pytest.raises(HintFieldError) as err:
        parse_hints({"agentkv": {"session": "s\n1"}})
    assert err.value.field == "session"


def test_names_in_the_rule_parse_at_their_limits():
    name = "web.search:v2@host/a_b-" + "x" * (128 - 23)
    got = parse_hints({"agentkv": {"session": "s" * 256, "branch": name, "events": [
        {"kind": "tool_start", "tool": name, "call_id": name}]}})
    assert (got.branch, got.events[0].tool, got.events[0].call_id) == (name, name, name)


def test_a_request_with_a_bad_name_is_served_without_agentkv_and_told_why():
    from agentkv_cluster.engines.vllm.backend import ConnectorCounters
    from agentkv_cluster.engines.vllm.blocks import EngineVersions
    from agentkv_cluster.engines.vllm.directory import EmbeddedDirectory, TokenResolver
    from agentkv_cluster.engines.vllm.scheduler import SchedulerSide

    sched = SchedulerSide(EmbeddedDirectory(TokenResolver(None, "acme")),
                          EngineVersions(model_version="m", tokenizer_version="t",
                                         rope_config="r"),
                          16, ConnectorCounters(), remote=False, lookup_timeout_s=1.0)
    tokens = list(range(100, 140))
    req = SimpleNamespace(request_id="r1", kv_transfer_params=_tool_start(tool="a\nb"),
                          prompt_token_ids=tokens, all_token_ids=tokens)
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    _, params = sched.request_finished(req, [])
    assert params["agentkv"]["errors"] == [
        "bad hints: tool must match [A-Za-z0-9_.:@/-]{1,128}"]
    assert sched.counters.hint_errors == 1
    sched.close()
