"""PURE. Workflow events, the event graph, state types, page identity and states."""
