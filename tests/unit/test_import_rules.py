"""The import rules of docs/architecture.md, checked on every source file with ``ast``.

- agentkv_cluster/lifecycle, policy, sim (pure) import no ray, redis, nixl, nixl_cu12, torch,
  and from ``store`` only ``store.types``;
- store never imports agentkv_cluster; security imports neither store nor agentkv_cluster;
- only agentkv_cluster/runtime imports ray; only store/transport* imports nixl;
  only files named like *redis* import redis.
Every import counts: module level, inside functions, under ``TYPE_CHECKING``, and
``importlib.import_module("x")`` / ``__import__("x")`` with a literal name.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("agentkv_cluster", "store", "security")
PURE = ("agentkv_cluster/lifecycle/", "agentkv_cluster/policy/", "agentkv_cluster/sim/")
HEAVY = {"ray", "redis", "nixl", "nixl_cu12", "torch"}
NIXL = {"nixl", "nixl_cu12"}

# Known breaches, each with its reason. The test fails when one is no longer needed,
# so this list can only shrink. Owners: move the import into a *redis* module.
KNOWN: dict[tuple[str, str], str] = {
}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    module: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.module}: {self.rule}"


def module_name(rel: PurePosixPath) -> tuple[str, bool]:
    """Dotted module name of a repo-relative path, and whether it is a package."""
    parts = list(rel.with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(parts), is_pkg


def imported_modules(source: str, rel: PurePosixPath) -> list[tuple[str, int]]:
    """Every absolute module name the source imports, with its line."""
    name, is_pkg = module_name(rel)
    package = name if is_pkg else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source, filename=str(rel))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, node.lineno))
            # `from store import codecs` imports store.codecs
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and _dynamic_import(node):
            out.append((node.args[0].value, node.lineno))  # type: ignore[attr-defined]
    return out


def _dynamic_import(node: ast.Call) -> bool:
    f = node.func
    named = (isinstance(f, ast.Name) and f.id in ("__import__", "import_module")) or (
        isinstance(f, ast.Attribute) and f.attr == "import_module"
    )
    return (named and len(node.args) >= 1 and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str))


def rule_for(rel: PurePosixPath, module: str) -> str | None:
    """The rule an import breaks, or None."""
    path = rel.as_posix()
    top = module.split(".")[0]
    if path.startswith(PURE):
        if top in HEAVY:
            return "pure packages import no ray/redis/nixl/torch"
        if top == "store" and module not in ("store", "store.types") \
                and not module.startswith("store.types."):
            return "pure packages import only store.types from store"
    if path.startswith("store/") and top == "agentkv_cluster":
        return "store never imports agentkv_cluster"
    if path.startswith("security/") and top in ("store", "agentkv_cluster"):
        return "security imports neither store nor agentkv_cluster"
    if top == "ray" and not path.startswith("agentkv_cluster/runtime/"):
        return "only agentkv_cluster/runtime imports ray"
    if top in NIXL and not path.startswith("store/transport"):
        return "only store/transport* imports nixl"
    if top == "redis" and "redis" not in rel.name:
        return "only files named like *redis* import redis"
    return None


def check_source(source: str, rel: PurePosixPath) -> list[Violation]:
    found = []
    for module, line in imported_modules(source, rel):
        rule = rule_for(rel, module)
        if rule is not None:
            found.append(Violation(rel.as_posix(), line, module, rule))
    return found


def _sources() -> list[PurePosixPath]:
    return sorted(PurePosixPath(p.relative_to(REPO).as_posix())
                  for top in CHECKED for p in (REPO / top).rglob("*.py"))


def test_tree_obeys_import_rules() -> None:
    assert len(_sources()) > 10
    found = [v for rel in _sources() for v in check_source((REPO / rel).read_text(), rel)]
    unexpected = [str(v) for v in found if (v.path, v.module.split(".")[0]) not in KNOWN]
    assert unexpected == []
    stale = set(KNOWN) - {(v.path, v.module.split(".")[0]) for v in found}
    assert stale == set(), "remove fixed entries from KNOWN"


@pytest.mark.parametrize(("path", "source", "rule"), [
    ("agentkv_cluster/lifecycle/x.py", "import torch\n", "no ray/redis/nixl/torch"),
    ("agentkv_cluster/policy/x.py", "def f():\n    import ray.util\n", "no ray/redis"),
    ("agentkv_cluster/sim/x.py", "from redis import Redis\n", "no ray/redis"),
    ("agentkv_cluster/sim/x.py", "import nixl_cu12 as nixl\n", "no ray/redis/nixl"),
    ("agentkv_cluster/sim/x.py", ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    import torch\n"), "no ray/redis/nixl/torch"),
    ("agentkv_cluster/policy/x.py", "from store.codecs import encode_kv\n", "only store.types"),
    ("agentkv_cluster/policy/x.py", "from store import codecs\n", "only store.types"),
    ("agentkv_cluster/policy/x.py", "import importlib\nimportlib.import_module('torch')\n",
     "no ray/redis/nixl/torch"),
    ("agentkv_cluster/policy/x.py", "__import__('redis')\n", "no ray/redis"),
    ("store/page.py", "from agentkv_cluster.lifecycle.identity import PageIdentity\n",
     "store never imports agentkv_cluster"),
    ("store/directory/embedded.py", "from ...agentkv_cluster import x\n", "store never"),
    ("security/keyring.py", "import store.types\n", "security imports neither"),
    ("security/keyring.py", "from agentkv_cluster import config\n", "security imports neither"),
    ("agentkv_cluster/api/server.py", "import ray\n", "only agentkv_cluster/runtime imports ray"),
    ("agentkv_cluster/cli/serve.py", "def h():\n    from ray import serve\n",
     "runtime imports ray"),
    ("store/nvme.py", "try:\n    import nixl\nexcept ImportError:\n    import nixl_cu12 as nixl\n",
     "only store/transport* imports nixl"),
    ("store/directory/embedded.py", "import redis.asyncio\n", "named like *redis*"),
    ("agentkv_cluster/cli/tenant.py", "def h():\n    import redis\n", "named like *redis*"),
])
def test_checker_catches_violation(path: str, source: str, rule: str) -> None:
    found = check_source(source, PurePosixPath(path))
    assert found, f"no violation found in {path}"
    assert all(rule in v.rule for v in found), [str(v) for v in found]


@pytest.mark.parametrize(("path", "source"), [
    ("agentkv_cluster/lifecycle/x.py", "import msgpack\nfrom store.types import Tier\n"),
    ("agentkv_cluster/sim/x.py", "from store import types\nimport store.types\n"),
    ("agentkv_cluster/policy/x.py", "import numpy as np\nfrom . import base\n"),
    ("agentkv_cluster/policy/x.py", "from ..lifecycle.types import StateType\n"),
    ("agentkv_cluster/runtime/actors.py", "import ray\nimport torch\n"),
    ("store/transport/nixl_ucx.py", ("try:\n    import nixl\nexcept ImportError:\n"
     "    import nixl_cu12 as nixl\n")),
    ("store/transport_nixl.py", "import nixl_cu12\n"),
    ("store/directory/redis_backend.py", "import redis\n"),
    ("security/redis_acl.py", "from redis import Redis\n"),
    ("store/codecs.py", "import torch\nfrom store.types import Codec\n"),
    ("security/sealing.py", "from cryptography.hazmat.primitives import hashes\n"),
])
def test_checker_accepts_allowed_imports(path: str, source: str) -> None:
    assert check_source(source, PurePosixPath(path)) == []


def test_relative_imports_resolve_to_absolute_names() -> None:
    mods = imported_modules("from ..runtime import actors\nfrom . import graph\n",
                            PurePosixPath("agentkv_cluster/lifecycle/__init__.py"))
    assert [m for m, _ in mods] == [
        "agentkv_cluster.runtime", "agentkv_cluster.runtime.actors",
        "agentkv_cluster.lifecycle", "agentkv_cluster.lifecycle.graph",
    ]


@pytest.mark.parametrize("package", ["store", "security", "agentkv_cluster"])
def test_packages_resolve_to_this_repository(package: str) -> None:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None
    assert Path(spec.origin).resolve() == REPO / package / "__init__.py"
