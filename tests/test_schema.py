"""The page's copy of the run-log field names (dashboard/src/lib/schema.js) agrees with
gradmon.logformat.schema."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gradmon.logformat import schema

SCHEMA_JS = Path(__file__).resolve().parent.parent / "dashboard" / "src" / "lib" / "schema.js"


def _js_schema() -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = f"process.stdout.write(JSON.stringify(require({json.dumps(str(SCHEMA_JS))}).SCHEMA))"
    out = subprocess.run([node, "-e", script], check=True, capture_output=True, text=True, timeout=30).stdout
    return json.loads(out)


@pytest.mark.parametrize("name", ["TEXT_KEYS", "INT_FIELDS", "NUMBER_FIELDS", "FLAG_FIELDS", "NOT_SERIES",
                                  "ALARM_KINDS", "ALARM_REASONS", "FORENSICS_KEYS"])
def test_js_lists_match_python(name: str) -> None:
    assert sorted(_js_schema()[name]) == sorted(getattr(schema, name))


def test_js_mark_flags_match_python() -> None:
    assert [tuple(pair) for pair in _js_schema()["MARK_FLAGS"]] == list(schema.MARK_FLAGS)


@pytest.mark.parametrize("name", ["OVERFLOW_REASON", "ALARM_RULE_FIELD", "DERIVED_SOURCE", "FORENSICS_FIELD"])
def test_js_constants_match_python(name: str) -> None:
    assert _js_schema()[name] == getattr(schema, name)


def test_js_names_nothing_python_lacks() -> None:
    assert set(_js_schema()) <= set(schema.__all__)


def test_flags_are_ring_columns() -> None:
    # The ring writes every flag the records carry; the records turn those columns into booleans.
    assert set(schema.FLAG_FIELDS) <= set(schema.HISTORY_BASE_FIELDS)
    assert {flag for flag, _kind in schema.MARK_FLAGS} <= set(schema.FLAG_FIELDS)
