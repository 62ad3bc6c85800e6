"""The order in which the suite's files start on the pytest-xdist workers: longest first.

``--dist loadfile`` keeps a file on one worker and hands out files in collection order (with
``--no-loadscope-reorder``; by default xdist orders them by their number of tests, which puts a
file of one long test, such as the real-Airflow approval or the install into a fresh Airflow,
last, and the other worker waits for it). Starting the longest files first leaves only short
ones for the end. ``durations.json`` holds each file's seconds from a run of the whole suite;
refresh it after a run that wrote a JUnit report::

    PYTEST_ADDOPTS=--junitxml=/tmp/junit.xml bash scripts/test.sh
    .venv/bin/python tests/durations.py /tmp/junit.xml > tests/durations.json

A file not listed (a new one) starts after the listed ones, in collection order.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

SECONDS = Path(__file__).with_name("durations.json")


def file_seconds(junit: str) -> dict[str, float]:
    """Seconds per test file (setup, call and teardown of its tests) from a JUnit report."""
    total: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x[.Class]
        name = next((p for p in parts if p.startswith("test_")), parts[-1]) + ".py"
        total[name] += float(case.get("time") or 0)
    return {k: round(v, 1) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}


def longest_first(items: list) -> None:
    """Sort collected test items so that files start longest first (stable within a file)."""
    try:
        seconds = json.loads(SECONDS.read_text())
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -float(seconds.get(Path(str(item.fspath)).name, 0.0)))


if __name__ == "__main__":
    print(json.dumps(file_seconds(sys.argv[1]), indent=1))
