"""Generational page directory: contract, embedded backend; Redis backend in ``redis_backend``."""

from store.directory.base import (
    CredentialsRefused,
    DeletesNamespaces,
    DirectoryAccessDenied,
    DirectoryBackend,
    DirectoryEntry,
    DirectoryError,
    DirectoryFull,
    DirectoryUnavailable,
    EntryInUse,
    GenerationRegression,
    InvalidEntry,
    MissingEntry,
    ReadOnlyGeneration,
    RefcountUnderflow,
    ReportsLostWrites,
    UnknownGeneration,
    WriteRefusal,
)
from store.directory.embedded import EmbeddedDirectory

__all__ = [
    "CredentialsRefused",
    "DeletesNamespaces",
    "DirectoryAccessDenied",
    "DirectoryBackend",
    "DirectoryEntry",
    "DirectoryError",
    "DirectoryFull",
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
    "WriteRefusal",
]
