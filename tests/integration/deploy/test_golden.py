"""Rendered manifests against reviewed golden files in tests/golden/deploy/.

After an intended chart change, regenerate and review the diff:
    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/integration/deploy/test_golden.py -q
"""

from __future__ import annotations

import difflib
import os

import pytest

from tests.integration.deploy import chart

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("value_set", chart.VALUE_SETS)
def test_rendered_manifests_match_golden(value_set):
    path = chart.GOLDEN_DIR / f"{value_set}.yaml"
    text = chart.manifest_text(value_set)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if not path.is_file():
        pytest.fail(f"{path} is missing; create it with UPDATE_GOLDEN=1 (see module docstring)")
    golden = path.read_text()
    diff = "".join(difflib.unified_diff(golden.splitlines(True), text.splitlines(True),
                                        f"golden/{value_set}.yaml", "rendered", n=2))
    assert text == golden, (f"rendered chart differs from {path} (rerun with UPDATE_GOLDEN=1 "
                            f"if the change is intended):\n{diff[:6000]}")
