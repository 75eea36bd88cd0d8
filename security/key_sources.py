"""Where 32-byte keys live: the ``KeySource`` protocol and its file and envelope
(KMS-wrapped) implementations. ``security.keyring`` derives and budgets the keys; it
re-exports these names. (``security.memory_keys`` is the in-memory source.)"""

from __future__ import annotations

import base64
import errno
import os
import re
from pathlib import Path
from typing import Protocol

from security import _primitives as prim
from security.errors import InvalidName, InvalidSeal, KeyExists, KeyUnavailable

_KEY_NAME_RE = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,127}")


class KeyDestroyed(KeyUnavailable):
    """A key file that holds only zero bytes: ``FileKeySource.destroy`` zeroes a key before
    it unlinks it, and a process killed between the two leaves this. It is not a key (32
    zero bytes would pass for one, and the rerun of the erasure would name a key id
    derived from them, or a directory namespace no tenant ever had); running the erasure
    again removes it."""


class KeySource(Protocol):
    """Where 32-byte keys live: files, a Kubernetes Secret volume, or a KMS."""

    def read(self, name: str) -> bytes: ...  # raises KeyUnavailable

    def create(self, name: str, material: bytes) -> None: ...  # raises KeyExists

    def destroy(self, name: str) -> bool: ...  # True if it existed

    def names(self) -> list[str]: ...

    def require_writable(self) -> None: ...  # KeyUnavailable if create/destroy cannot work


def _check_key_name(name: str) -> str:
    if not _KEY_NAME_RE.fullmatch(name):
        raise InvalidName(f"invalid key name: {name!r:.80}")
    return name


def _decode_material(raw: bytes, name: str) -> bytes:
    if len(raw) == prim.KEY_BYTES:
        return raw
    try:  # a Secret created from text holds base64
        decoded = base64.b64decode(raw.strip(), validate=True)
    except ValueError:
        decoded = b""
    if len(decoded) != prim.KEY_BYTES:
        raise KeyUnavailable(f"key {name} is not 32 raw bytes or base64 of 32 bytes")
    return decoded


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` at ``fd``. One ``os.write`` may write fewer (a disk
    that fills midway): the rest is written, and a full disk then raises ``ENOSPC``
    instead of leaving a short file that looks written."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, "no byte written")
        view = view[n:]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of folder ``path`` durable (a file created, renamed or removed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileKeySource:
    """One file per key in a flat directory (a mounted Kubernetes Secret works read-only)."""

    def __init__(self, directory: str | os.PathLike[str], *, writable: bool = True) -> None:
        self.directory = Path(directory)
        self.writable = writable
        if writable:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        elif not self.directory.is_dir():
            raise KeyUnavailable(f"key directory {self.directory} does not exist")

    def read(self, name: str) -> bytes:
        return _decode_material(self.read_blob(name), name)

    def read_blob(self, name: str) -> bytes:
        """The stored bytes as they are (a wrapped key for ``WrappedKeySource``)."""
        path = self.directory / _check_key_name(name)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            raise KeyUnavailable(f"key {name} does not exist") from None
        if blob and not blob.strip(b"\0"):  # (markers are empty, keys are never all zero)
            raise KeyDestroyed(f"key {name} was zeroed by a destroy that was cut off before "
                               "it removed the file: it is destroyed; run the erasure again "
                               "to finish it")
        return blob

    def create(self, name: str, material: bytes) -> None:
        self.require_writable()
        path = self.directory / _check_key_name(name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise KeyExists(f"key {name} already exists") from None
        except OSError as exc:
            raise self._refused(exc) from None
        try:
            try:
                write_all(fd, material)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:  # a short key must never stay behind under the name
            path.unlink(missing_ok=True)
            raise
        fsync_dir(self.directory)

    def destroy(self, name: str) -> bool:
        self.require_writable()
        path = self.directory / _check_key_name(name)
        try:
            fd = os.open(path, os.O_WRONLY)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._refused(exc) from None
        try:  # overwrite before unlinking (best effort on CoW/flash, see docs/security.md)
            size = os.fstat(fd).st_size
            write_all(fd, b"\0" * size)
            os.fsync(fd)
        finally:
            os.close(fd)
        path.unlink()
        fsync_dir(self.directory)
        return True

    def names(self) -> list[str]:
        return sorted(p.name for p in self.directory.iterdir() if _KEY_NAME_RE.fullmatch(p.name))

    def require_writable(self) -> None:
        """``KeyUnavailable`` unless keys can be created and destroyed here: opened
        read-only, or a read-only mount (a Kubernetes Secret volume)."""
        if not self.writable or not os.access(self.directory, os.W_OK):
            raise KeyUnavailable(f"key directory {self.directory} is read-only (a mounted "
                                 "Secret?): nothing was changed; run this where the keys "
                                 "are writable")

    def _refused(self, exc: OSError) -> KeyUnavailable:
        return KeyUnavailable(f"key directory {self.directory} refused the change "
                              f"({exc.strerror}): nothing was changed")



class KeyWrapper(Protocol):
    """Envelope encryption: an external KMS implements these two calls."""

    def wrap(self, material: bytes, name: str) -> bytes: ...

    def unwrap(self, blob: bytes, name: str) -> bytes: ...  # raises KeyUnavailable


class LocalKeyWrapper:
    """A ``KeyWrapper`` with a local 32-byte master key (AES-256-GCM, name as AAD)."""

    def __init__(self, master_key: bytes) -> None:
        self._aead = prim.Aead(master_key)

    def wrap(self, material: bytes, name: str) -> bytes:
        nonce = prim.random_bytes(prim.NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, material, name.encode())

    def unwrap(self, blob: bytes, name: str) -> bytes:
        try:
            return self._aead.decrypt(blob[: prim.NONCE_BYTES], blob[prim.NONCE_BYTES :], name.encode())
        except (InvalidSeal, ValueError):
            raise KeyUnavailable(f"key {name} does not unwrap") from None


class BlobStore(Protocol):
    """What ``WrappedKeySource`` stores wrapped keys in (``FileKeySource`` is one)."""

    def read_blob(self, name: str) -> bytes: ...

    def create(self, name: str, material: bytes) -> None: ...

    def destroy(self, name: str) -> bool: ...

    def names(self) -> list[str]: ...

    def require_writable(self) -> None: ...


class WrappedKeySource:
    """Stores only wrapped keys in ``inner``; ``wrapper`` (a KMS) unwraps on read."""

    def __init__(self, inner: BlobStore, wrapper: KeyWrapper) -> None:
        self.inner = inner
        self.wrapper = wrapper

    def read(self, name: str) -> bytes:
        material = self.wrapper.unwrap(self.inner.read_blob(name), name)
        if len(material) != prim.KEY_BYTES:
            raise KeyUnavailable(f"key {name} unwraps to the wrong length")
        return material

    def create(self, name: str, material: bytes) -> None:
        self.inner.create(name, self.wrapper.wrap(material, name))

    def destroy(self, name: str) -> bool:
        return self.inner.destroy(name)

    def names(self) -> list[str]:
        return self.inner.names()

    def require_writable(self) -> None:
        self.inner.require_writable()
