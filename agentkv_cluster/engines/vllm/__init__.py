"""AgentKV inside vLLM: a v1 KV connector with agent lifecycle hints (``docs/engines.md``).

Only ``connector.py`` imports vLLM; the rest (hints, block identities, backends, the
scheduler-side bookkeeping and the worker-side byte moves) imports without it.
"""

CONNECTOR_NAME = "AgentKVConnector"
CONNECTOR_MODULE = "agentkv_cluster.engines.vllm.connector"
SUPPORTED_VLLM = ("0.32",)  # KVConnectorBase_V1 signatures checked against these


def kv_transfer_config(**extra: object) -> dict[str, object]:
    """The ``--kv-transfer-config`` / ``KVTransferConfig(**...)`` for this connector."""
    return {"kv_connector": CONNECTOR_NAME, "kv_role": "kv_both",
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": dict(extra)}
