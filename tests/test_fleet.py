"""A thousand sinks in one Airflow (issue 50): a task's parse builds its own DAG from its own sink
file, parsing reads nothing but the sink files, and a process validates a file once.

What runs where: the DAG file is parsed in this process by Airflow's own ``DagBag`` (as the
dag-processor does, and under Airflow's parsing context as a task's parse does), with an audit
hook recording the files opened and any database or network connection; a real task (``airflow
tasks test SINK mint``: Airflow's CLI parses under the parsing context) runs against a SQLite
ledger. The sink files are the fleet benchmark's (bench/fleet.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bench.fleet import sink_text, write_sinks

from helpers import airflow_task_test

ROOT = Path(__file__).resolve().parents[1]
AUDITED = ("open", "os.scandir", "os.listdir", "socket.connect", "socket.getaddrinfo", "sqlite3.connect")
_seen: list[tuple[str, tuple]] | None = None


def _hook(event: str, args: tuple) -> None:
    if _seen is not None and event in AUDITED:
        _seen.append((event, args))


sys.addaudithook(_hook)  # an audit hook stays for the process: it records only inside audited()


@contextmanager
def audited() -> Iterator[list[tuple[str, tuple]]]:
    """The audit events of :data:`AUDITED` this process raises inside the block."""
    global _seen
    _seen = []
    try:
        yield _seen
    finally:
        _seen = None


def opened_under(events, folder: Path) -> list[str]:
    """The files under ``folder`` opened (and the folder's listings, as ``<list>``)."""
    inside = str(folder) + os.sep
    out = []
    for event, args in events:
        target = str(args[0]) if args and isinstance(args[0], str | os.PathLike) else ""
        if event == "open" and target.startswith(inside):
            out.append(target)
        elif event in ("os.scandir", "os.listdir") and target.rstrip(os.sep) == str(folder):
            out.append("<list>")
    return out


@contextmanager
def parsing_context(dag_id: str, task_id: str) -> Iterator[None]:
    """Airflow's own parsing context (the task runner's), its variables removed afterwards
    (Airflow's manager leaves them set: a task's process ends after its one parse)."""
    from airflow.sdk.definitions._internal.dag_parsing_context import _airflow_parsing_context_manager

    try:
        with _airflow_parsing_context_manager(dag_id=dag_id, task_id=task_id):
            yield
    finally:
        os.environ.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
        os.environ.pop("_AIRFLOW_PARSING_CONTEXT_TASK_ID", None)


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


def _serialized(dag) -> dict:
    """The DAG as the dag-processor stores it (without when and where it was loaded)."""
    from airflow.serialization.serialized_objects import DagSerialization

    data = DagSerialization.to_dict(dag)["dag"]
    return {k: v for k, v in data.items() if k not in ("fileloc", "relative_fileloc", "last_loaded")}


@pytest.fixture
def fleet(tmp_path, monkeypatch) -> tuple[Path, list[str]]:
    """120 sink files of the benchmark's fleet, a sink defined in a file named otherwise, and an
    invalid file; this process's sinks folder."""
    sinks = tmp_path / "sinks"
    names = write_sinks(sinks, 120)
    (sinks / "team_x_orders.yaml").write_text(sink_text("renamed_sink", "query", 1))
    (sinks / "broken.yaml").write_text("name: broken\nkind: query\nschema: []\nstart_date: 2026-01-01\n")
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(sinks))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(tmp_path / "wh"))
    return sinks, names


@pytest.mark.airflow
def test_a_tasks_parse_builds_its_own_dag_from_its_own_file(fleet, airflow_db):
    """Under Airflow's parsing context (what the task runner and ``airflow tasks`` set), the DAG
    file builds the one DAG the task needs, from the one file named after its sink: nothing else
    in the folder is listed or opened. Without it (the dag-processor) every sink's DAG is built,
    and the task's DAG is the same DAG."""
    sinks, names = fleet
    target = names[55]  # an upsert sink with a lag alert (a deadline) and a correction guard
    with audited() as events, parsing_context(target, "append"):
        alone = _dagbag()
    assert alone.import_errors == {}
    assert alone.dag_ids == [target]
    assert opened_under(events, sinks) == [str(sinks / f"{target}.yaml")]

    everything = _dagbag()  # the dag-processor's parse
    assert everything.import_errors == {}
    assert set(everything.dag_ids) == {*names, "renamed_sink", "invalid_sink_config__broken"}
    assert _serialized(alone.get_dag(target)) == _serialized(everything.get_dag(target))
    assert everything.get_dag(target).deadline is not None

    # DAGs no file is named after: the whole folder, as the dag-processor builds it
    for dag_id in ("renamed_sink", "invalid_sink_config__broken"):
        with parsing_context(dag_id, "mint"):
            bag = _dagbag()
        assert dag_id in bag.dag_ids and len(bag.dag_ids) == len(everything.dag_ids), dag_id


def test_the_file_named_after_a_sink_defines_it(tmp_path):
    """Two files naming one sink: the file named after it wins (a task reads only that file),
    whatever the order; a sink named in another file is still found."""
    from reconcile.config_loading import load_dir, load_sink

    (tmp_path / "a_first.yaml").write_text(sink_text("orders", "query", 1))
    (tmp_path / "orders.yaml").write_text(sink_text("orders", "upsert", 2))
    (tmp_path / "b_other.yaml").write_text(sink_text("ledger", "changelog", 3))
    configs, errors = load_dir(tmp_path)
    assert [(c.name, c.kind, Path(c.path).name) for c in configs] == [
        ("ledger", "changelog", "b_other.yaml"),
        ("orders", "upsert", "orders.yaml"),
    ]
    assert [(Path(e.path).name, e.field) for e in errors] == [("a_first.yaml", "name")]
    assert f"sink 'orders' is also defined in {tmp_path / 'orders.yaml'}" in str(errors[0])
    with audited() as events:
        assert load_sink("orders", tmp_path) is configs[1]  # validated above: not again
    assert opened_under(events, tmp_path) == [str(tmp_path / "orders.yaml")]  # no listing of the folder
    assert load_sink("ledger", tmp_path).path == str(tmp_path / "b_other.yaml")


@pytest.mark.airflow
def test_a_real_task_run_parses_only_its_sink(fleet, tmp_path, airflow_db):
    """``airflow tasks test SINK mint``: Airflow's CLI parses the DAG file under the parsing
    context; the DAG file builds that sink's DAG alone, and the task mints the run's batch into
    the ledger."""
    from reconcile.config_loading import load_file
    from reconcile.schedule import to_millis
    from reconcile.storage.ledger import Ledger

    sinks, names = fleet
    target, logical = names[7], datetime(2026, 1, 2, 5, tzinfo=UTC)
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    env = {
        "RECONCILE_METADATA_URL": url,
        "RECONCILE_SINKS_DIR": str(sinks),
        "RECONCILE_WAREHOUSE": str(tmp_path / "wh"),
    }
    text = airflow_task_test(target, "mint", logical, **env)
    assert f"parsed for a task of DAG {target}: built its DAG alone, from {sinks / f'{target}.yaml'}" in text
    ledger = Ledger(url)
    try:
        (batch,) = ledger.batches(target)  # the first batch: from the sink's as_of to the run's logical date
        assert (batch.state, batch.lower, batch.upper) == (
            "minted",
            load_file(sinks / f"{target}.yaml").as_of,
            to_millis(logical),
        )
    finally:
        ledger.dispose()


# --- parsing costs little: libyaml, nothing but the sink files read, each validated once ----------

UNREACHABLE = {  # a ledger and a warehouse nobody answers for
    "RECONCILE_METADATA_URL": "postgresql+psycopg://nobody:x@10.255.255.1:5432/ledger",
    "RECONCILE_WAREHOUSE": "s3://unreachable-bucket/warehouse",
    "AWS_ENDPOINT_URL": "http://10.255.255.1:9000",
}


@pytest.mark.airflow
def test_parsing_reads_the_sink_files_and_nothing_else(fleet, monkeypatch, airflow_db):
    """The dag-processor's parse with the ledger and the warehouse pointing at unreachable
    places: every DAG is built, each sink file is read once (by libyaml), and nothing connects to
    a database or the network."""
    import yaml

    from reconcile import config_loading

    sinks, names = fleet
    for key, value in UNREACHABLE.items():
        monkeypatch.setenv(key, value)
    with audited() as events:
        bag = _dagbag()
    assert bag.import_errors == {}
    assert len(bag.dag_ids) == len(names) + 2  # the renamed sink, the broken file's placeholder
    assert [e for e in events if e[0] in ("socket.connect", "socket.getaddrinfo", "sqlite3.connect")] == []
    files = sorted(str(p) for p in sinks.glob("*.yaml"))
    assert sorted(opened_under(events, sinks)) == sorted(["<list>", *files])
    assert yaml.__with_libyaml__ and config_loading.SafeLoader is yaml.CSafeLoader


def test_a_process_validates_an_unchanged_file_once(tmp_path, monkeypatch):
    """A sink file is validated again only when its modification time or size, or what its
    ``${VAR}`` expand to, changed; a file rewritten within the file system's timestamp
    granularity (same size, same mtime) is told apart by its text."""
    from reconcile.config_loading import load_dir, load_file

    names = write_sinks(tmp_path, 5)
    past = 1_700_000_000_000_000_000
    for i, name in enumerate(names):  # written long ago: their stat alone vouches for them
        os.utime(tmp_path / f"{name}.yaml", ns=(past + i, past + i))
    first, errors = load_dir(tmp_path)
    assert errors == [] and [c.name for c in first] == names
    with audited() as events:
        again, _ = load_dir(tmp_path)
    assert [a is b for a, b in zip(first, again, strict=True)] == [True] * 5
    assert opened_under(events, tmp_path) == ["<list>"]  # the listing; no file read

    path = tmp_path / f"{names[2]}.yaml"
    text = path.read_text()
    path.write_text(text.replace("partitions: 6", "partitions: 7"))  # same size
    os.utime(path, ns=(past + 99, past + 99))
    changed = load_file(path)
    assert changed is not first[2] and changed.partitions == 7

    monkeypatch.setenv("RECONCILE_HOME", str(tmp_path / "elsewhere"))  # the sources' ${RECONCILE_HOME}
    moved = load_file(tmp_path / f"{names[0]}.yaml")
    assert moved is not first[0]
    assert {s.path for s in moved.sources} == {
        f"{tmp_path}/elsewhere/fleet-data/{names[0]}/{t}" for t in ("orders", "customers")
    }

    fresh = tmp_path / "fresh.yaml"  # racy: rewritten at once, same size, its mtime put back
    fresh.write_text(sink_text("fresh", "query", 1))  # partitions: 5
    stat = fresh.stat()
    assert load_file(fresh).partitions == 5
    fresh.write_text(fresh.read_text().replace("partitions: 5", "partitions: 8"))
    os.utime(fresh, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert load_file(fresh).partitions == 8


# --- the fleet's health: status without a sink, --json, the overview ----------------------------


def _commit_file(log: Path, version: int, actions: list[dict]) -> None:
    """A Delta commit file written as another writer writes one (one JSON action a line)."""
    import json

    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


@pytest.fixture
def small_fleet(tmp_path, monkeypatch, ledger):
    """Ten sinks of the benchmark's fleet, 45 hourly batches each up to the last full hour
    (bench/fleet.py's ``fill_ledger``: failed, late and behind sinks among them), on the
    ``ledger`` fixture's database (SQLite, PostgreSQL); then, with Delta log files: a foreign
    write after sink 1's last batch (not yet repaired) and sink 0's current-state table one
    version behind its shard; an OPTIMIZE after sink 2's last batch (no drift); a sink never run
    and an invalid file. Yields (now, {sink: the
    state it must be in}, the sinks folder)."""
    from bench.fleet import fill_ledger

    from reconcile.schedule import now_ms
    from reconcile.storage.current import CurrentTable
    from reconcile.storage.delta import ShardTable

    now = now_ms()
    as_of = (now // 3_600_000 - 45) * 3_600_000
    start = datetime.fromtimestamp(as_of / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sinks, wh = tmp_path / "sinks", tmp_path / "wh"
    names = write_sinks(sinks, 10, start=start)
    (sinks / "zz_never_run.yaml").write_text(sink_text("zz_never_run", "query", 1, start=start))
    (sinks / "broken.yaml").write_text("name: broken\nkind: query\nschema: []\nstart_date: 2026-01-01\n")
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(sinks))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(wh))
    fate = fill_ledger(ledger.url, names, 45, as_of)
    expected = {name: fate[name] for name in names} | {"zz_never_run": "new", "broken": "invalid"}

    from reconcile.config_loading import load_sink

    last = {n: ledger.get_shard(n).delta_version for n in names[:2]}
    foreign = {
        "add": {"path": "x.parquet", "size": 1, "dataChange": True, "modificationTime": 0, "partitionValues": {}}
    }
    _commit_file(Path(ShardTable(load_sink(names[1])).log_path), last[names[1]] + 1, [{"commitInfo": {}}, foreign])
    expected[names[1]] = "unrepaired"
    cfg0 = load_sink(names[0])
    assert cfg0.current is not None and fate[names[0]] == "ok"
    _commit_file(Path(ShardTable(cfg0).log_path), last[names[0]], [{"commitInfo": {"operation": "WRITE"}}])
    current = CurrentTable(cfg0)
    current.create()  # its version 0, as the sink creates it
    txn = {"txn": {"appId": current.app_id, "version": last[names[0]] - 1}}
    _commit_file(Path(current.log_path), 1, [{"commitInfo": {"operation": "current"}}, txn])
    expected[names[0]] = "current_lagging"
    # sink 2: a version after its last batch that is no foreign write (an OPTIMIZE), noted by a sync
    after = ledger.get_shard(names[2]).delta_version + 1
    _commit_file(Path(ShardTable(load_sink(names[2])).log_path), after, [{"commitInfo": {"operation": "OPTIMIZE"}}])
    ledger.note_delta_version(names[2], after)
    assert fate[names[2]] == "ok"
    yield now, expected, sinks


STATE_ORDER = ["invalid", "failed", "late", "unrepaired", "current_lagging", "behind", "new", "ok"]


def test_status_of_every_sink_lists_those_needing_action_first(small_fleet, ledger, capsys):
    """``status`` without a sink: a line of counts per state, then one line a sink, the sinks
    needing action first (by state, then name); each sink's state what the fleet was left in,
    its exit code ``status SINK``'s, the fleet's the worst of them. ``--json`` says the same."""
    import json
    from collections import Counter

    from bench.fleet import LATE_HOURS

    from reconcile.cli import main
    from reconcile.config_loading import load_sink
    from reconcile.report import duration

    now, expected, _ = small_fleet
    code = main(["status"])
    out = capsys.readouterr().out.splitlines()
    want = Counter(expected.values())
    head = f"{len(expected)} sink(s): " + ", ".join(f"{want[s]} {s.replace('_', ' ')}" for s in STATE_ORDER if want[s])
    assert out[0].startswith(f"{head} (needing action: {sum(want[s] for s in STATE_ORDER[:5])}; now ")
    rows = [line.split() for line in out[2:]]
    assert [(r[0], r[1]) for r in rows] == sorted(
        ((s, n) for n, s in expected.items()), key=lambda p: (STATE_ORDER.index(p[0]), p[1])
    )
    by_name = {line.split()[1]: line for line in out[2:]}
    failed = next(n for n, s in expected.items() if s == "failed")
    assert "final: source path" in by_name[failed] and "Remedy: restore the source" in by_name[failed]
    late = next(n for n, s in expected.items() if s == "late")
    minutes = load_sink(late).alert.lag_minutes or 120  # its alert, else twice its hourly schedule
    lag = duration(LATE_HOURS * 3_600_000).rsplit(" ", 1)[0]  # minutes aside: the clock moves
    assert f"lags {lag} " in by_name[late] and f"(alert past {duration(minutes * 60_000)})" in by_name[late]
    behind = next(n for n, s in expected.items() if s == "behind")
    assert "BEHIND: the shard is behind" in by_name[behind] and "clear its run now" in by_name[behind]
    assert "foreign Delta versions" in by_name["fleet_0001"] and "not yet repaired" in by_name["fleet_0001"]
    assert "current table reflects shard version" in by_name["fleet_0000"]
    assert "the sink file does not load" in by_name["broken"] and "schema" in by_name["broken"]

    # each sink's exit code is status SINK's; the fleet's is the worst (a failed sink: 1)
    assert code == 1
    assert main(["status", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {s: want[s] for s in STATE_ORDER}
    assert data["exit_code"] == 1 and data["needs_action"] == sum(want[s] for s in STATE_ORDER[:5])
    assert {e["sink"]: e["state"] for e in data["sinks"]} == expected
    for entry in data["sinks"]:
        if entry["state"] in ("new", "invalid"):
            continue
        assert main(["status", entry["sink"]]) == entry["exit_code"], entry
        capsys.readouterr()
    codes = {e["sink"]: e["exit_code"] for e in data["sinks"]}
    assert codes["fleet_0001"] == 4 and codes[failed] == 1 and codes["broken"] == 1
    assert {codes[n] for n, s in expected.items() if s in ("ok", "late", "behind", "current_lagging")} == {0}


def test_the_fleet_costs_three_ledger_queries(small_fleet, ledger):
    """The sinks whose Delta log the ledger can vouch for cost three queries for the whole fleet
    (every shard, their newest batches, their batches past the upper), however many they are; a
    sink whose log holds a version the ledger does not know is read like ``status SINK`` reads
    it."""
    from sqlalchemy import event

    from reconcile import fleet
    from reconcile.config_loading import load_dir

    now, expected, _ = small_fleet
    configs, errors = load_dir()
    statements: list[str] = []
    listen = lambda *a: statements.append(a[2][:60]) if a[2].startswith("SELECT") else None  # noqa: E731
    event.listen(ledger.engine, "before_cursor_execute", listen)
    plain = [c for c in configs if expected[c.name] != "unrepaired"]
    healths = fleet.survey(ledger, plain, [], now)
    assert len(statements) == 3, "\n".join(statements)
    assert {h.name: h.state for h in healths} == {c.name: expected[c.name] for c in plain}
    statements.clear()
    fleet.survey(ledger, configs, errors, now)
    assert 3 < len(statements) <= 8  # the unrepaired sink's own reads (report.foreign_unrepaired)


def test_check_all_checks_each_sink_as_check_sink_does(small_fleet, capsys):
    """``check --all``: each sink's check in turn, its lines as ``check SINK`` prints them (its
    error, when it cannot check it: here the sinks' Delta tables were never written), an invalid
    file as a NEEDS ACTION line, then the counts; the exit code is the worst (1 over 2 over 4)."""
    from reconcile.cli import main
    from reconcile.config_loading import load_dir
    from reconcile.errors import brief

    _, expected, _ = small_fleet
    configs, _ = load_dir()
    single = {}
    for cfg in configs:
        try:
            code = main(["check", cfg.name])
        except Exception as exc:  # noqa: BLE001 - a log check cannot read (sink 0's: no metadata action)
            code, raised = 2, f"error: sink {cfg.name!r}: could not be checked: {brief(exc)}"
        else:
            raised = None
        out, err = capsys.readouterr()
        single[cfg.name] = (code, [raised] if raised else (out + err).strip().splitlines())
    assert main(["check", "--all"]) == 1  # the invalid file
    lines = capsys.readouterr().out.splitlines()
    for name, (_, said) in single.items():
        assert said[:-1] == [
            line.removeprefix(f"{name}: ") for line in lines if line.startswith(f"{name}: ") and line != said[-1]
        ], name
        assert said[-1] in lines, name
    assert any(line.startswith("NEEDS ACTION: invalid sink file: ") and "broken.yaml: field" in line for line in lines)
    codes = [code for code, _ in single.values()]
    assert lines[-1] == (
        f"checked {len(configs)} sink(s): {codes.count(0)} fine, {codes.count(1)} needing action, "
        f"{codes.count(4)} not yet repaired, {codes.count(2)} could not be checked; 1 invalid sink file(s)"
    )
    assert len(expected) == len(configs) + 1
