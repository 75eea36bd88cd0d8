"""What the transformers adapter raises: one base class, one class per failure."""

from __future__ import annotations


class EngineAdapterError(Exception):
    """Base class for engine-adapter failures."""


class UnsupportedCache(EngineAdapterError, ValueError):
    """The cache is not a batch-1 `DynamicCache` of full-attention layers, or not this
    model's KV (another layer count, head geometry or dtype)."""


class CorruptPage(EngineAdapterError):
    """A stored page's bytes changed since they were written (checksum), or they decode
    to another page, shape or dtype than its identity says."""


class ContextTooLong(EngineAdapterError, ValueError):
    """More tokens than the model has positions for (RoPE past its trained range)."""


class EmptyInput(EngineAdapterError, ValueError):
    """No tokens to run through the model."""


class InvalidTokens(EngineAdapterError, ValueError):
    """Token ids that are not one flat sequence of integers in the model's vocabulary."""


class InvalidForms(EngineAdapterError, ValueError):
    """Forms ``store`` cannot write: none at all, or RECOMPUTE (it holds no KV)."""
