"""The layout draws the protocol: each layer imports only the layers above it, and the stages
meet only through ``sink.sync``, ``sink.verify`` and ``model`` (read from the source with ast)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "include" / "reconcile"
STAGES = {"mint", "write", "append", "compact", "check"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        rel = path.relative_to(PKG).with_suffix("")
        name = ".".join(("reconcile", *rel.parts)).removesuffix(".__init__")
        out[name] = path
    return out


def imports_of(path: Path) -> set[str]:
    """Every ``reconcile...`` module a file imports (``from reconcile.x import y`` counts both
    ``reconcile.x`` and ``reconcile.x.y``, since y may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reconcile")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("reconcile"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


MODULES = modules()
IMPORTS = {name: {i for i in imports_of(path) if i in MODULES} for name, path in MODULES.items()}


def test_the_layout_exists():
    for name in (
        "reconcile.model",
        "reconcile.differential",
        "reconcile.storage.delta",
        "reconcile.storage.ledger",
        "reconcile.sink.sync",
        "reconcile.sink.run",
        "reconcile.airflow.dags",
        "reconcile.kinds",
    ):
        assert name in MODULES, name
    assert {f"reconcile.sink.{s}" for s in STAGES} <= set(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_import_rules(name):
    deps = IMPORTS[name]
    if name == "reconcile.model":
        assert not deps, f"model imports nothing of the sink: {deps}"
    if name.startswith(("reconcile.storage", "reconcile.kinds", "reconcile.differential", "reconcile.config")):
        bad = {d for d in deps if d.startswith(("reconcile.sink", "reconcile.airflow", "reconcile.cli"))}
        assert not bad, f"{name} is below the stages and must not import {bad}"
    if name.startswith(("reconcile.kinds", "reconcile.differential")):
        bad = {d for d in deps if d.startswith("reconcile.storage")}
        assert not bad, f"{name} is pure (no I/O of the shard): {bad}"
    stage = name.removeprefix("reconcile.sink.")
    if stage in STAGES:
        other = {d for d in deps if d.removeprefix("reconcile.sink.") in STAGES - {stage}}
        assert not other, f"stage {stage} meets the others only through sync, verify and model: {other}"
    if not name.startswith(("reconcile.airflow", "reconcile.cli")):
        bad = {d for d in deps if d.startswith("reconcile.airflow")}
        assert not bad, f"{name} must not depend on Airflow's layer: {bad}"
