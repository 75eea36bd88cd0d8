"""Generational page directory: contract, embedded backend; Redis backend in ``redis_backend``."""

from store.directory.base import (
    CredentialsRefused,
    DeletesNamespaces,
    DirectoryAccessDenied,
    DirectoryBackend,
    DirectoryEntry,
    DirectoryError,
    DirectoryUnavailable,
    EntryInUse,
    GenerationRegression,
    InvalidEntry,
    MissingEntry,
    ReadOnlyGeneration,
    RefcountUnderflow,
    ReportsLostWrites,
    UnknownGeneration,
)
from store.directory.embedded import EmbeddedDirectory

__all__ = [
    "CredentialsRefused",
    "DeletesNamespaces",
    "DirectoryAccessDenied",
    "DirectoryBackend",
    "DirectoryEntry",
    "DirectoryError",
    "DirectoryUnavailable",
    "EmbeddedDirectory",
    "EntryInUse",
    "GenerationRegression",
    "InvalidEntry",
    "MissingEntry",
    "ReadOnlyGeneration",
    "RefcountUnderflow",
    "ReportsLostWrites",
    "UnknownGeneration",
]
