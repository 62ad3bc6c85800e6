"""The layout draws the protocol: each layer imports only the layers above it, and the stages
meet only through ``sink.sync``, ``sink.verify`` and ``model`` (read from the source with ast)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import parse_source

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
    for node in ast.walk(parse_source(path)):
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
        "reconcile.storage.engine",
        "reconcile.storage.ledger",
        "reconcile.storage.ledger_rows",
        "reconcile.storage.lease",
        "reconcile.sink.sync",
        "reconcile.sink.run",
        "reconcile.airflow.dags",
        "reconcile.airflow.operators",
        "reconcile.airflow.callbacks",
        "reconcile.airflow.ui",
        "reconcile.airflow.charts",
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


def _sink_models() -> set[str]:
    """The config models of the sink kinds (the subclasses of ``SinkConfig`` in config.py)."""
    tree = parse_source(PKG / "config.py")
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "SinkConfig" for b in node.bases)
    }


def kind_checks(path: Path, models: set[str], kinds: set[str]) -> list[str]:
    """Where a file asks which kind a sink is: ``isinstance``/``issubclass`` with a sink model, a
    comparison with a model, with an attribute ``kind`` or with a kind's name, a ``match`` on
    ``.kind`` or a case of a model (each as ``file:line: code``)."""

    def named(expr: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(expr) if isinstance(n, ast.Attribute)
        }

    def asks(expr: ast.AST) -> bool:
        if isinstance(expr, ast.Attribute) and expr.attr == "kind":
            return True
        if isinstance(expr, ast.Name | ast.Attribute) and named(expr) & models:
            return True
        values = expr.elts if isinstance(expr, ast.Tuple | ast.List | ast.Set) else [expr]
        return any(isinstance(v, ast.Constant) and v.value in kinds for v in values)

    found: list[tuple[int, str]] = []
    for node in ast.walk(parse_source(path)):
        hit = (
            (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and bool(named(node.args[-1]) & models)
            )
            or (isinstance(node, ast.Compare) and any(asks(x) for x in (node.left, *node.comparators)))
            or (isinstance(node, ast.Match) and asks(node.subject))
            or (isinstance(node, ast.MatchClass) and bool(named(node.cls) & models))
        )
        if hit:
            found.append(
                (
                    node.lineno,
                    f"{path.relative_to(PKG.parents[1])}:{node.lineno}: {ast.unparse(node).splitlines()[0][:80]}",
                )
            )
    return [line for _, line in sorted(found)]


def test_only_the_kinds_ask_which_kind_a_sink_is():
    """The stages, the history, the CLI and the DAGs ask the sink's kind (``reconcile.kinds.of``)
    what to do; only ``reconcile.kinds`` and the config modules (``reconcile.config*``) tell the kinds
    apart."""
    models = _sink_models()
    assert models == {"QuerySink", "ChangelogSink", "UpsertSink"}, models
    kinds = {"query", "changelog", "upsert"}
    root = PKG.parents[1]
    files = [p for n, p in MODULES.items() if not n.startswith(("reconcile.kinds", "reconcile.config"))]
    files += [p for d in ("dags", "jobs", "plugins") for p in (root / d).rglob("*.py")]
    found = [line for path in files for line in kind_checks(path, models, kinds)]
    assert not found, "kind checks outside reconcile.kinds (ask kinds.of(cfg) instead):\n" + "\n".join(found)
    # the check sees the checks it forbids
    assert len(kind_checks(PKG / "kinds" / "__init__.py", models, kinds)) >= 3


def modules_imported(path: Path) -> set[str]:
    """The ``reconcile`` modules a file imports, at the top or inside a function (``from
    reconcile.x import y`` imports the module ``reconcile.x.y`` if there is one, else
    ``reconcile.x``)."""
    found = set()
    for node in ast.walk(parse_source(path)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            }
    return found & set(MODULES)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of ``graph`` (module: the modules it imports) closes, each
    as the path back to where it started (a module importing itself does not count)."""
    cycles: list[list[str]] = []
    done: set[str] = set()
    path: list[str] = []

    def walk(name: str) -> None:
        path.append(name)
        for dep in sorted(graph.get(name, set()) - {name}):
            if dep in path:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in done:
                walk(dep)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            walk(name)
    return cycles


def test_no_import_cycles():
    """No module of the package imports, directly or through others, a module that imports it
    (``demo`` and ``cli`` once did, for the status report)."""
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # it sees one
    graph = {name: modules_imported(path) for name, path in MODULES.items()}
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_test_module_imports_another():
    """Shared helpers and models live in tests/helpers.py, upsert_model.py, history_model.py and
    tests/object_store_harness.py (the servers themselves are harness/'s); a test module imports none of the others."""
    tests = Path(__file__).resolve().parent
    names = {p.stem for p in tests.glob("test_*.py")}
    found = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(parse_source(path)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            found += [f"{path.name} imports {m}" for m in mods if m.split(".")[0] in names]
    assert found == []
