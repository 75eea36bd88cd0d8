"""The connector inside a real vLLM engine, embedded backend (host pool + NVMe shard in
the engine's worker process), real SmolLM2-135M: restore is token-exact and not
recomputed, tenants never share blocks, PUBLIC only on opt-in, bad hints are answered."""

from __future__ import annotations

import time

import pytest

from tests.integration.vllm.conftest import (
    counter,
    generate,
    generate_ids,
    prompt,
    report,
    require_vllm,
    start_engine,
    token_secret,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BLOCK = 128  # vLLM's CPU block size


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    require_vllm()
    from security.principals import TokenIssuer

    secret, secret_file = token_secret(tmp_path_factory)
    llm = start_engine({"backend": "embedded", "strategy": "agentkv", "host_blocks": 16,
                        "nvme_blocks": 32, "token_secret_file": secret_file,
                        "default_tenant": None})
    issuer = TokenIssuer(secret)

    def token(tenant, **kw):
        return issuer.issue(tenant, subject="agent", now=time.time(), **kw)
    yield llm, token
    llm.llm_engine.engine_core.shutdown()
    del llm


def _evict(llm):
    """Empty vLLM's own KV cache (prefix cache), as a long tool call under load would."""
    assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache"


def test_restored_prefix_gives_identical_greedy_tokens_without_recompute(engine):
    llm, token = engine
    text = prompt(1)
    hints = {"session": "agent-1", "token": token("acme")}
    first = generate(llm, text, hints, max_tokens=16)  # computed; the connector saves it
    n_prompt = len(first.prompt_token_ids)
    assert n_prompt > 4 * BLOCK
    _evict(llm)
    hits_before = counter(llm, "vllm:external_prefix_cache_hits")
    again = generate(llm, text, {**hints, "events": [{"kind": "observation_return"}]},
                     max_tokens=16)
    assert list(again.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    restored = report(again)["restored_tokens"]
    assert restored == (n_prompt - 1) // BLOCK * BLOCK  # every full block but the last token's
    assert again.num_cached_tokens == restored  # vLLM computed only the rest
    assert counter(llm, "vllm:external_prefix_cache_hits") - hits_before == restored
    assert "errors" not in report(again)


def test_the_turn_that_ends_the_task_still_restores_its_prefix(engine):
    """A task_end carried by the last turn's own request waits until that request's loads
    are done (applied first, it retired the blocks the request was restoring: restored
    0, "... could not be restored; recomputed"); after it the session's blocks retire."""
    llm, token = engine
    text = prompt(5)
    hints = {"session": "agent-end", "token": token("acme")}
    first = generate(llm, text, hints, max_tokens=8)
    _evict(llm)
    last = generate(llm, text, {**hints, "events": [{"kind": "task_end", "ok": True}]},
                    max_tokens=8)
    assert list(last.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    assert report(last)["restored_tokens"] == (len(first.prompt_token_ids) - 1) // BLOCK * BLOCK
    assert "errors" not in report(last), report(last)
    assert last.num_cached_tokens == report(last)["restored_tokens"]


def test_next_turn_restores_the_previous_turns_partial_last_block(engine):
    """An agent's next prompt repeats the last one and its output; the last block of the
    finished turn is only partly filled. The connector keeps that tail too: the next turn
    restores every token the last one computed, token-exact against a full recompute."""
    llm, token = engine
    base = list(generate(llm, prompt(7), max_tokens=1).prompt_token_ids)
    _evict(llm)
    turn1 = base[:4 * BLOCK + 40]
    hints = {"session": "agent-t", "token": token("acme")}
    first = generate_ids(llm, turn1, hints, max_tokens=16)
    out1 = list(first.outputs[0].token_ids)
    computed = len(turn1) + len(out1) - 1  # the last output token's KV is never computed
    assert computed % BLOCK >= 16  # a tail the connector keeps (min_tail_tokens)
    turn2 = turn1 + out1 + base[4 * BLOCK + 60:4 * BLOCK + 160]  # + the tool's observation
    time.sleep(1.0)  # the engine's next step copies the tail out (the request has finished)
    _evict(llm)
    again = generate_ids(llm, turn2, {**hints, "events": [{"kind": "observation_return"}]},
                         max_tokens=16)
    assert report(again)["restored_tokens"] == computed, report(again)
    assert again.num_cached_tokens == computed
    _evict(llm)  # the same prompt computed from scratch (another tenant matches nothing)
    fresh = generate_ids(llm, turn2, {"session": "other", "token": token("globex")},
                         max_tokens=16)
    assert report(fresh)["restored_tokens"] == 0
    assert list(again.outputs[0].token_ids) == list(fresh.outputs[0].token_ids)


def test_tenant_b_never_matches_tenant_a(engine):
    llm, token = engine
    text = prompt(2)
    generate(llm, text, {"session": "a-2", "token": token("acme")})
    _evict(llm)
    hits_before = counter(llm, "vllm:external_prefix_cache_hits")
    out = generate(llm, text, {"session": "b-2", "token": token("globex")})
    assert report(out)["restored_tokens"] == 0
    assert report(out)["tenant"] == "globex"
    assert counter(llm, "vllm:external_prefix_cache_hits") == hits_before
    _evict(llm)  # tenant A still gets its own blocks back
    out = generate(llm, text, {"session": "a-2", "token": token("acme")})
    assert report(out)["restored_tokens"] > 0


def test_public_prefix_is_shared_only_with_tenants_that_opted_in(engine):
    llm, token = engine
    text = prompt(3)
    admin = token("acme", roles=("tenant", "admin", "publish"))
    published = generate(llm, text, {"session": "pub", "token": admin, "publish": True})
    assert "errors" not in report(published)
    _evict(llm)
    out = generate(llm, text, {"session": "c-3", "token": token("initech", public_read=True)})
    assert report(out)["restored_tokens"] > 0
    assert list(out.outputs[0].token_ids) == list(published.outputs[0].token_ids)
    _evict(llm)
    out = generate(llm, text, {"session": "d-3", "token": token("umbrella")})
    assert report(out)["restored_tokens"] == 0
    # without the publish role (an admin included) nobody publishes: blocks stay its own
    out = generate(llm, prompt(4), {"session": "e", "token": token("umbrella"), "publish": True})
    assert any("publish role" in e for e in report(out)["errors"])
    out = generate(llm, prompt(4), {"session": "e2", "publish": True,
                                    "token": token("umbrella", roles=("tenant", "admin"))})
    assert any("publish role" in e for e in report(out)["errors"])


@pytest.mark.parametrize("hints, fragment", [
    ({"session": "x", "bogus": 1}, "unknown hint fields"),
    ({"session": "x", "events": [{"kind": "tool_exploded"}]}, "unknown event kind"),
    ({"session": "x", "events": [{"kind": "tool_start"}]}, "tool class"),
    ({"session": "x", "token": "akv1.forged.token"}, "invalid AgentKV token"),
    ({"session": "x"}, "needs an AgentKV token"),
])
def test_bad_hints_get_a_clear_error_and_the_engine_keeps_serving(engine, hints, fragment):
    llm, token = engine
    out = generate(llm, "hello there, agent", hints, max_tokens=4)
    assert len(out.outputs[0].token_ids) == 4  # served (without AgentKV)
    errors = report(out)["errors"]
    assert any(fragment in e for e in errors), errors
    good = generate(llm, "hello there, agent", {"session": "ok", "token": token("acme")},
                    max_tokens=4)
    assert "errors" not in report(good)


def test_abandoning_a_branch_keeps_the_prefix_the_next_branch_continues_from(engine):
    """A request names its branch; abandoning that branch retires the blocks only it
    wrote, while the trunk's blocks it read stay (any branch_abandoned used to retire the
    whole session, and the next attempt recomputed the shared prefix)."""
    llm, token = engine
    base = list(generate(llm, prompt(9, words=1200), max_tokens=1).prompt_token_ids)
    assert len(base) > 5 * BLOCK
    _evict(llm)
    hints = {"session": "agent-br", "token": token("acme")}
    trunk, tried = base[:3 * BLOCK], base[:5 * BLOCK]
    generate_ids(llm, trunk, hints, max_tokens=1)  # the trunk's 3 blocks saved
    time.sleep(1.0)  # saved after the request finished (next engine step)
    _evict(llm)
    attempt = generate_ids(llm, tried, {**hints, "branch": "try-1"}, max_tokens=1)
    assert report(attempt)["restored_tokens"] == 3 * BLOCK  # the branch reads the trunk
    time.sleep(1.0)
    _evict(llm)
    drop = generate_ids(llm, trunk, {**hints, "events": [{"kind": "branch_abandoned",
                                                           "branch": "try-1"}]},
                        max_tokens=1)
    assert "errors" not in report(drop), report(drop)
    time.sleep(1.0)  # the held event is applied on the next engine step
    _evict(llm)
    generate_ids(llm, base[:BLOCK], {"session": "idle", "token": token("acme")}, max_tokens=1)
    _evict(llm)
    again = generate_ids(llm, tried, hints, max_tokens=1)
    assert report(again)["restored_tokens"] == 3 * BLOCK, report(again)  # trunk only
