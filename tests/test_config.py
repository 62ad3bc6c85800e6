"""Sink config validation: every problem is a one-line ConfigError naming the file and field."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from helpers import parse_source
from reconcile.config import TYPES, ChangelogSink, Column, QuerySink, Source, UpsertSink
from reconcile.config_loading import load_dir, load_file
from reconcile.config_messages import problems_of
from reconcile.errors import ConfigError

QUERY = {
    "name": "orders_daily",
    "kind": "query",
    "description": "orders per day",
    "schema": [
        {"name": "k", "type": "bigint", "nullable": False},
        {"name": "v", "type": "string"},
    ],
    "partitions": 8,
    "schedule": "0 3 * * *",
    "start_date": "2024-01-01",
    "as_of": "2024-01-02",
    "retries": 5,
    "read_only": True,
    "retention": {"vacuum_hours": 24, "history_hours": 48},
    "compaction": {"every_batches": 5},
    "query": {
        "sources": {
            "orders": {"format": "csv", "path": "data/orders", "options": {"header": True, "sep": ";"}},
            "users": {"format": "delta", "path": "/abs/users"},
            "events": {"format": "parquet", "path": "s3://bucket/events"},
        },
        "sql": "SELECT k, v FROM orders",
    },
}
CHANGELOG = {
    "name": "ledger",
    "kind": "changelog",
    "schema": [{"name": "k", "type": "bigint"}, {"name": "amount", "type": "decimal(10, 2)"}],
    "schedule": "none",
    "start_date": "2024-03-01T06:00:00Z",
    "changelog": {"source": {"format": "json", "path": "log"}, "time_column": "ts", "diff_column": "diff"},
}
UPSERT = {
    "name": "customers",
    "kind": "upsert",
    "schema": [
        {"name": "id", "type": "bigint"},
        {"name": "region", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "score", "type": "int"},
    ],
    "start_date": "2024-01-01",
    "upsert": {
        "source": {"format": "parquet", "path": "cdc/customers"},
        "key": ["id", "region"],
        "time_column": "ts",
        "offset_column": "lsn",
        "delete": {"column": "op", "values": ["d", 3]},
    },
}


def write(directory: Path, filename: str, data) -> Path:
    path = directory / filename
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def variant(base: dict, *drop: str, **set_) -> dict:
    """A deep copy of base with dotted fields dropped or set ("query.sql", "schema.0.name")."""
    data = copy.deepcopy(base)
    for dotted, value in [(d, ...) for d in drop] + list(set_.items()):
        *parents, last = dotted.split(".")
        node = data
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        key = int(last) if isinstance(node, list) else last
        if value is ...:
            del node[key]
        else:
            node[key] = value
    return data


def expect_error(directory: Path, data, field: str, filename: str = "sink.yaml") -> ConfigError:
    path = write(directory, filename, data)
    with pytest.raises(ConfigError) as info:
        load_file(path)
    err = info.value
    assert err.path == str(path)
    assert err.field == field
    text = str(err)
    assert "\n" not in text, f"message is not one line: {text!r}"
    assert str(path) in text and f"'{field}'" in text
    return err


# --- valid configs ---------------------------------------------------------------------------


def test_query_config_parses_into_fields(tmp_path):
    cfg = load_file(write(tmp_path, "orders_daily.yaml", QUERY))
    assert (cfg.name, cfg.kind, cfg.description) == ("orders_daily", "query", "orders per day")
    assert cfg.columns == (Column("k", "bigint", False), Column("v", "string", True))
    assert (cfg.partitions, cfg.schedule, cfg.retries, cfg.read_only) == (8, "0 3 * * *", 5, True)
    assert cfg.start_date == datetime(2024, 1, 1, tzinfo=UTC)
    assert cfg.as_of == 1704153600000  # 2024-01-02T00:00:00Z in epoch ms
    assert cfg.vacuum_retention_hours == 24
    assert (cfg.history_retention_hours, cfg.compact_every_batches) == (48, 5)
    assert cfg.sql == "SELECT k, v FROM orders"
    assert cfg.path == str(tmp_path / "orders_daily.yaml")
    assert cfg.sources == (
        Source("orders", "csv", str((tmp_path / "data" / "orders").resolve()), (("header", "true"), ("sep", ";"))),
        Source("users", "delta", "/abs/users"),
        Source("events", "parquet", "s3://bucket/events"),
    )
    assert isinstance(cfg, QuerySink)  # one model per kind: no other kind's fields
    assert not hasattr(cfg, "source") and not hasattr(cfg, "time_column")


def test_changelog_config_parses_with_defaults(tmp_path):
    cfg = load_file(write(tmp_path, "ledger.yaml", CHANGELOG))
    assert cfg.kind == "changelog"
    assert cfg.source == Source("source", "json", str((tmp_path / "log").resolve()))
    assert (cfg.time_column, cfg.diff_column) == ("ts", "diff")
    assert cfg.columns[1] == Column("amount", "decimal(10, 2)", True)
    assert cfg.schedule is None  # "none" means unscheduled
    start = datetime(2024, 3, 1, 6, tzinfo=UTC)
    assert cfg.start_date == start
    assert cfg.as_of == int(start.timestamp() * 1000)  # as_of defaults to start_date
    assert (cfg.partitions, cfg.retries, cfg.read_only, cfg.catchup) == (4, 2, False, False)
    assert cfg.vacuum_retention_hours == 168
    assert (cfg.history_retention_hours, cfg.compact_every_batches) == (168, 20)
    assert isinstance(cfg, ChangelogSink) and not hasattr(cfg, "sql")


def test_upsert_config_parses_keys_values_and_delete_marker(tmp_path):
    cfg = load_file(write(tmp_path, "customers.yaml", UPSERT))
    assert cfg.kind == "upsert" and isinstance(cfg, UpsertSink)
    assert cfg.source == Source("source", "parquet", str((tmp_path / "cdc" / "customers").resolve()))
    assert cfg.key_columns == ("id", "region") and cfg.value_columns == ["name", "score"]
    assert (cfg.time_column, cfg.offset_column) == ("ts", "lsn")
    assert (cfg.delete_column, cfg.delete_values) == ("op", ("d", "3"))
    # without a delete section, a command whose values are all null is a delete; key as a string
    plain = load_file(write(tmp_path, "plain.yaml", variant(UPSERT, "upsert.delete", **{"upsert.key": "id"})))
    assert plain.key_columns == ("id",) and plain.delete_column is None
    assert plain.value_columns == ["region", "name", "score"]


def test_name_defaults_to_file_stem(tmp_path):
    assert load_file(write(tmp_path, "from_stem.yaml", variant(CHANGELOG, "name"))).name == "from_stem"


# --- invalid configs -------------------------------------------------------------------------

CASES = {
    "missing kind": (variant(QUERY, "kind"), "kind"),
    "missing schema": (variant(QUERY, "schema"), "schema"),
    "empty schema": (variant(QUERY, schema=[]), "schema"),
    "missing start_date": (variant(QUERY, "start_date"), "start_date"),
    "missing query section": (variant(QUERY, "query"), "query"),
    "missing query.sql": (variant(QUERY, "query.sql"), "query.sql"),
    "missing changelog.time_column": (variant(CHANGELOG, "changelog.time_column"), "changelog.time_column"),
    "partitions wrong type": (variant(QUERY, partitions="four"), "partitions"),
    "partitions bool": (variant(QUERY, partitions=True), "partitions"),
    "nullable wrong type": (variant(QUERY, **{"schema.0.nullable": "no"}), "schema[0].nullable"),
    "unknown kind": (variant(QUERY, kind="stream"), "kind"),
    "unknown top-level field": (variant(QUERY, partition=4), "partition"),
    "unknown column field": (variant(QUERY, **{"schema.1.default": "x"}), "schema[1].default"),
    "sql injection in name": (variant(QUERY, name="orders; DROP TABLE x"), "name"),
    "path traversal in name": (variant(QUERY, name="../etc"), "name"),
    "uppercase name": (variant(QUERY, name="Orders"), "name"),
    "column with space": (variant(QUERY, **{"schema.0.name": "a b"}), "schema[0].name"),
    "column with sql": (variant(QUERY, **{"schema.1.name": "x)--"}), "schema[1].name"),
    "column starting with digit": (variant(QUERY, **{"schema.1.name": "1x"}), "schema[1].name"),
    "reserved _time": (variant(QUERY, **{"schema.0.name": "_time"}), "schema[0].name"),
    "reserved _diff": (variant(QUERY, **{"schema.1.name": "_diff"}), "schema[1].name"),
    "reserved any case": (variant(QUERY, **{"schema.1.name": "_Error"}), "schema[1].name"),
    "duplicate column": (variant(QUERY, **{"schema.1.name": "k"}), "schema[1].name"),
    "duplicate column any case": (variant(QUERY, **{"schema.1.name": "K"}), "schema[1].name"),
    "unsupported type": (variant(QUERY, **{"schema.1.type": "map<string,int>"}), "schema[1].type"),
    "decimal precision over 38": (variant(QUERY, **{"schema.1.type": "decimal(40,2)"}), "schema[1].type"),
    "decimal scale over precision": (variant(QUERY, **{"schema.1.type": "decimal(5,7)"}), "schema[1].type"),
    "type with sql": (variant(QUERY, **{"schema.1.type": "string) --"}), "schema[1].type"),
    "bad schedule": (variant(QUERY, schedule="every day"), "schedule"),
    "unknown refresh": (variant(QUERY, **{"query.refresh": "incremntal"}), "query.refresh"),
    "incremental refresh over json": (variant(QUERY, **{"query.refresh": "incremental"}), "query.refresh"),
    "negative full_every": (variant(QUERY, **{"query.full_every": {"batches": -1}}), "query.full_every.batches"),
    "unknown full_every field": (variant(QUERY, **{"query.full_every": {"days": 1}}), "query.full_every.days"),
    "partitions 0": (variant(QUERY, partitions=0), "partitions"),
    "partitions 5000": (variant(QUERY, partitions=5000), "partitions"),
    "negative retries": (variant(QUERY, retries=-1), "retries"),
    "bad as_of": (variant(QUERY, as_of="yesterday"), "as_of"),
    "negative as_of": (variant(QUERY, as_of=-1), "as_of"),
    "bad start_date": (variant(QUERY, start_date="soon"), "start_date"),
    "source name not identifier": (
        variant(QUERY, **{"query.sources": {"my-src": {"format": "json", "path": "x"}}}),
        "query.sources.my-src",
    ),
    "source name with sql": (
        variant(QUERY, **{"query.sources": {"t; DROP": {"format": "json", "path": "x"}}}),
        "query.sources.t; DROP",
    ),
    "unknown source format": (variant(QUERY, **{"query.sources.users.format": "avro"}), "query.sources.users.format"),
    "unknown changelog format": (variant(CHANGELOG, **{"changelog.source.format": "kafka"}), "changelog.source.format"),
    "empty source path": (variant(QUERY, **{"query.sources.users.path": " "}), "query.sources.users.path"),
    "time column not identifier": (variant(CHANGELOG, **{"changelog.time_column": "ts)"}), "changelog.time_column"),
    "unknown retention field": (variant(QUERY, retention={"days": 3}), "retention.days"),
    "negative history hours": (variant(QUERY, retention={"history_hours": -1}), "retention.history_hours"),
    "history hours not an int": (variant(QUERY, retention={"history_hours": "a day"}), "retention.history_hours"),
    "unknown compaction field": (variant(QUERY, compaction={"every": 3}), "compaction.every"),
    "negative compaction cadence": (variant(QUERY, compaction={"every_batches": -2}), "compaction.every_batches"),
    "compaction not a mapping": (variant(QUERY, compaction=[1]), "compaction"),
    "upsert without section": (variant(UPSERT, "upsert"), "upsert"),
    "upsert without key": (variant(UPSERT, "upsert.key"), "upsert.key"),
    "upsert empty key": (variant(UPSERT, **{"upsert.key": []}), "upsert.key"),
    "upsert key not in schema": (variant(UPSERT, **{"upsert.key": ["id", "nope"]}), "upsert.key[1]"),
    "upsert key twice": (variant(UPSERT, **{"upsert.key": ["id", "ID"]}), "upsert.key"),
    "upsert without offset": (variant(UPSERT, "upsert.offset_column"), "upsert.offset_column"),
    "upsert time column in schema": (variant(UPSERT, **{"upsert.time_column": "score"}), "upsert.time_column"),
    "upsert offset equals time": (variant(UPSERT, **{"upsert.offset_column": "ts"}), "upsert.offset_column"),
    "upsert offset with sql": (variant(UPSERT, **{"upsert.offset_column": "lsn; --"}), "upsert.offset_column"),
    "upsert delete column in schema": (variant(UPSERT, **{"upsert.delete.column": "name"}), "upsert.delete.column"),
    "upsert delete without values": (variant(UPSERT, **{"upsert.delete.values": []}), "upsert.delete.values"),
    "upsert key-only without delete": (
        variant(UPSERT, "upsert.delete", schema=[{"name": "id", "type": "bigint"}], **{"upsert.key": ["id"]}),
        "upsert.delete",
    ),
    "upsert unknown field": (variant(UPSERT, **{"upsert.order": "x"}), "upsert.order"),
    "root not a mapping": ([QUERY], "<root>"),
    "empty file": ("", "<root>"),
}


@pytest.mark.parametrize("data,field", CASES.values(), ids=CASES.keys())
def test_invalid_config_names_file_and_field(tmp_path, data, field):
    expect_error(tmp_path, data, field)


def test_invalid_file_stem_without_name(tmp_path):
    err = expect_error(tmp_path, variant(QUERY, "name"), "name", filename="My Sink.yaml")
    assert "My Sink" in str(err)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_file(tmp_path / "nope.yaml")
    assert (info.value.path, info.value.field) == (str(tmp_path / "nope.yaml"), "<file>")


def test_invalid_yaml_names_file(tmp_path):
    path = write(tmp_path, "broken.yaml", "name: x\nkind: [query\n")
    with pytest.raises(ConfigError) as info:
        load_file(path)
    assert (info.value.path, info.value.field) == (str(path), "<file>")
    assert "not valid YAML" in str(info.value)


def test_invalid_yaml_message_is_one_line(tmp_path):
    expect_error(tmp_path, "name: x\nkind: [query\n", "<file>")


@pytest.mark.parametrize("schedule", ["61 * * * *", "a b c d e"])
def test_invalid_cron_schedule(tmp_path, schedule):
    expect_error(tmp_path, variant(QUERY, schedule=schedule), "schedule")


def test_negative_vacuum_hours(tmp_path):
    expect_error(tmp_path, variant(QUERY, retention={"vacuum_hours": -1}), "retention.vacuum_hours")


# --- load_dir ---------------------------------------------------------------------------------


def test_load_dir_separates_valid_configs_and_errors(tmp_path):
    a = write(tmp_path, "a.yaml", variant(QUERY, name="orders"))
    b = write(tmp_path, "b.yaml", variant(CHANGELOG, name="orders"))  # duplicate sink name
    c = write(tmp_path, "c.yaml", variant(QUERY, name="broken", partitions=0))
    d = write(tmp_path, "d.yml", variant(CHANGELOG, name="ledger"))
    (tmp_path / "notes.txt").write_text("not a config")

    configs, errors = load_dir(tmp_path)

    assert [(cfg.name, cfg.kind, cfg.path) for cfg in configs] == [
        ("orders", "query", str(a)),
        ("ledger", "changelog", str(d)),
    ]
    assert [(e.path, e.field) for e in errors] == [(str(b), "name"), (str(c), "partitions")]
    assert str(a) in str(errors[0]) and "'orders'" in str(errors[0])
    assert all("\n" not in str(e) for e in errors)


def test_schema_command_prints_a_json_schema_that_accepts_the_examples(tmp_path, capsys):
    """`python -m reconcile schema`: editors complete and check sink files with it."""
    import json

    from reconcile.cli import main

    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    kinds = schema["discriminator"]["mapping"]
    assert set(kinds) == {"query", "changelog", "upsert"}
    query = schema["$defs"]["QuerySink"]
    assert query["additionalProperties"] is False and "schema" in query["properties"]
    assert set(query["required"]) >= {"kind", "schema", "start_date", "query"}


def test_unknown_field_is_named_with_where_to_look(tmp_path):
    err = expect_error(tmp_path, variant(UPSERT, **{"upsert.source.compression": "gzip"}), "upsert.source.compression")
    assert "unknown field" in str(err) and "reconcile schema" in str(err)


# --- every problem at once, said so that the user knows what to write -------------------------


def load_problems(path: Path) -> list[ConfigError]:
    with pytest.raises(ConfigError) as info:
        load_file(path)
    problems = problems_of(info.value)
    for p in problems:
        assert p.path == str(path) and "\n" not in str(p), p
        assert str(p).startswith(f"sink '{p.sink}': config {path}: field '{p.field}': ") or p.sink is None
    assert str(info.value) == "\n".join(str(p) for p in problems)
    return problems


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    data = variant(
        UPSERT,
        "upsert.time_column",
        partitions=0,
        partiton=3,
        **{
            "schema.0.type": "int64",
            "schema.1.name": "_time",
            "schema.3.nullable": "no",
            "upsert.source.format": "avro",
            "upsert.time_colum": "ts",
        },
    )
    problems = load_problems(write(tmp_path, "customers.yaml", data))
    fields = [p.field for p in problems]
    assert sorted(fields) == sorted(
        [
            "schema[0].type",
            "schema[1].name",
            "schema[3].nullable",
            "partitions",
            "upsert.source.format",
            "upsert.time_column",
            "upsert.time_colum",
            "partiton",
        ]
    ), fields
    assert len(set(fields)) == len(fields)


def test_cross_field_problems_are_reported_beside_the_others(tmp_path):
    """The upsert section's checks against the schema run although another field is invalid."""
    data = variant(UPSERT, partitions=0, **{"upsert.key": ["id", "nope"], "upsert.time_column": "score"})
    fields = {p.field for p in load_problems(write(tmp_path, "customers.yaml", data))}
    assert fields == {"partitions", "upsert.key[1]", "upsert.time_column"}


def test_misspelled_required_field_is_named_as_unknown_with_the_nearest_name(tmp_path):
    data = variant(CHANGELOG, "changelog.time_column", **{"changelog.time_colum": "ts"})
    problems = {p.field: str(p) for p in load_problems(write(tmp_path, "ledger.yaml", data))}
    assert set(problems) == {"changelog.time_colum", "changelog.time_column"}
    assert "unknown field; did you mean `time_column`?" in problems["changelog.time_colum"]
    assert "allowed here: source, time_column, diff_column" in problems["changelog.time_colum"]
    assert "is required (the file has `time_colum`: misspelled?)" in problems["changelog.time_column"]


def test_unknown_fields_are_named_when_the_kind_is_missing(tmp_path):
    data = variant(QUERY, "kind", partiton=2, retries=-1, **{"schema.1.type": "int64"})
    problems = {p.field: str(p) for p in load_problems(write(tmp_path, "orders_daily.yaml", data))}
    assert set(problems) == {"kind", "partiton", "retries", "schema[1].type"}  # and the fields every kind has
    assert "query, changelog, upsert" in problems["kind"]
    assert "did you mean `partitions`?" in problems["partiton"]


def test_another_kinds_section_says_whose_it_is(tmp_path):
    data = variant(QUERY, changelog=CHANGELOG["changelog"])
    (problem,) = load_problems(write(tmp_path, "orders_daily.yaml", data))
    assert problem.field == "changelog" and "section of kind 'changelog'" in str(problem)


ALLOWED = {
    "type": ({"schema.1.type": "int64"}, "schema[1].type", ["did you mean `bigint`?", *TYPES]),
    "type typo": ({"schema.1.type": "strng"}, "schema[1].type", ["did you mean `string`?", "timestamp_ntz"]),
    "kind": ({"kind": "querry"}, "kind", ["did you mean `query`?", "query, changelog, upsert"]),
    "kind a boolean": ({"kind": True}, "kind", ["YAML reads `true` as a boolean", "query, changelog, upsert"]),
    "format": ({"query.sources.users.format": "avro"}, "query.sources.users.format", ["delta, parquet, csv, json"]),
    "format typo": ({"query.sources.users.format": "parqet"}, "query.sources.users.format", ["`parquet`"]),
    "schedule": ({"schedule": "daily"}, "schedule", ["@daily", "@hourly", "none"]),
}


@pytest.mark.parametrize("change,field,listed", ALLOWED.values(), ids=ALLOWED.keys())
def test_a_value_outside_a_closed_set_lists_the_allowed_values(tmp_path, change, field, listed):
    text = str(expect_error(tmp_path, variant(QUERY, **change), field))
    assert all(word in text for word in listed), text


YAML_WORDS = {
    "off as offset column": ("offset_column: lsn", "offset_column: off", "upsert.offset_column", "off"),
    "on as time column": ("time_column: ts", "time_column: on", "upsert.time_column", "on"),
    "yes as a delete value": ("values: [d, 3]", "values: [d, yes]", "upsert.delete.values[1]", "yes"),
    "On as a column name": ("name: score", "name: On", "schema[3].name", "On"),
}


@pytest.mark.parametrize("before,after,field,word", YAML_WORDS.values(), ids=YAML_WORDS.keys())
def test_a_yaml_boolean_where_text_belongs_says_to_quote_it(tmp_path, before, after, field, word):
    text = yaml.safe_dump(UPSERT, sort_keys=False, default_flow_style=None)
    assert before in text
    err = expect_error(tmp_path, text.replace(before, after), field)
    assert f"YAML reads `{word}` as a boolean" in str(err) and f"quote it, '{word}'" in str(err), str(err)
    fixed = load_file(write(tmp_path, "fixed.yaml", text.replace(before, after.replace(f" {word}", f" '{word}'"))))
    assert word in repr(fixed.upsert) + repr(fixed.columns)


# --- the JSON schema agrees with the loader ---------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


class EditorLoader(yaml.SafeLoader):
    """YAML as an editor checks it against a JSON schema: a date or time is text (JSON has none)."""


EditorLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


@pytest.fixture(scope="module")
def schema_check():
    """The schema `python -m reconcile schema` prints, as a validator: (file text) -> its errors."""
    import json

    import jsonschema

    from reconcile.cli import main

    with pytest.MonkeyPatch.context() as mp:
        out: list[str] = []
        mp.setattr("builtins.print", lambda text, **_: out.append(text))
        assert main(["schema"]) == 0
    validator = jsonschema.Draft202012Validator(json.loads(out[0]))
    jsonschema.Draft202012Validator.check_schema(validator.schema)

    def errors(text: str) -> list[str]:
        data = yaml.load(text, Loader=EditorLoader)
        return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(data)]

    return errors


# The functions of the tests' harness that write a sink config (found by
# test_every_config_writer_of_the_tests_is_listed), whose configs the schema must accept.
WRITERS = {"helpers.make_sink", "helpers.daily_sink", "helpers.orders_config", "chaos.__init__"}
# Functions that build a config but write none that should be valid.
NOT_WRITERS = {
    "test_airflow.test_invalid_config_is_visible_without_hiding_valid_sinks": "a copy of the demo sink, and one "
    "invalid on purpose",
    "test_plugin.shard_pages": "an invalid config on purpose",
    "test_correction.config": "a config parsed from a dict in memory (the fields of helpers.make_sink)",
    "test_fleet.fleet": "an invalid config on purpose (the sinks are bench/fleet.py's, checked below)",
    "test_fleet.small_fleet": "an invalid config on purpose (the sinks are bench/fleet.py's, checked below)",
}


def configs_the_tests_write(root: Path) -> list[Path]:
    """One file per way the tests write a sink config (the writers above, with the fields the
    tests pass them)."""
    import chaos
    import helpers
    import upsert_model

    def folder(name: str) -> Path:
        (root / name).mkdir(parents=True)
        return root / name

    make = folder("make_sink")
    helpers.make_sink(make, "query")
    helpers.make_sink(make, "changelog", "changelog")
    upsert_model.upsert_sink(make, name="upsert", partitions=2, retention={"history_hours": 0})
    guard = {"max_share": 0.2, "min_rows": 5}
    helpers.make_sink(make, "guarded", correction_guard=guard, query=helpers.json_query("src"))
    helpers.make_sink(make, "paged", schedule="@hourly", alert={"lag_minutes": 5})
    helpers.make_sink(make, "catchup", schedule="@daily", catchup=True, as_of="2026-01-01T00:00:00Z")
    helpers.make_sink(make, "manual", schedule="none", read_only=True, partitions=4)
    helpers.make_sink(make, "retained", retention={"history_hours": 0, "vacuum_hours": 0})
    schema = [
        {"name": "order", "type": "bigint"},
        {"name": "at", "type": "timestamp"},
        {"name": "amount", "type": "decimal(38,9)"},
    ]
    helpers.make_sink(make, "typed", schema=schema, as_of=0)
    daily = folder("daily")
    helpers.daily_sink(daily, "af_query", query=helpers.json_query(root / "src"))
    helpers.daily_sink(
        daily,
        "af_compact",
        query=helpers.json_query(root / "src"),
        compaction={"every_batches": 2},
        retention={"history_hours": 36},
    )
    upsert = {
        "source": {"format": "json", "path": str(root / "feed")},
        "key": ["k"],
        "time_column": "ts",
        "offset_column": "off",
    }
    helpers.daily_sink(daily, "af_upsert", "upsert", upsert=upsert)
    helpers.daily_sink(
        daily, "cq", retries=0, query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT 1"}
    )
    helpers.daily_sink(daily, "cu", "upsert", retries=0, upsert=upsert)
    helpers.daily_sink(
        daily, "sched", schedule="none", as_of=100, catchup=False, query=helpers.json_query(root / "src")
    )
    helpers.orders_config(folder("bad_input"))
    from bench.fleet import write_sinks

    write_sinks(folder("fleet"), 12)  # every kind, and each option the fleet benchmark's sinks use
    chaos.Schedule(None, None, folder("chaos"), 1, 0, chaos.Stats())
    return sorted(root.rglob("*.yaml"))


def test_every_config_writer_of_the_tests_is_listed():
    """A function of the tests that builds a sink config (a dict with a "kind" key, or YAML text
    with a kind: line) is one whose configs the schema checks, or is listed as writing none."""
    import ast

    found = set()
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name == "test_config.py":
            continue
        for node in ast.walk(parse_source(path)):
            if not isinstance(node, ast.FunctionDef):
                continue
            for inner in ast.walk(node):
                keyed = isinstance(inner, ast.Dict) and any(
                    isinstance(k, ast.Constant) and k.value == "kind" for k in inner.keys
                )
                text = isinstance(inner, ast.Constant) and isinstance(inner.value, str)
                if keyed or (text and re.search(r"(^|\n)kind:", inner.value)):
                    found.add(f"{path.stem}.{node.name}")
    assert found == WRITERS | set(NOT_WRITERS)


def test_schema_accepts_every_example_and_test_config(tmp_path, schema_check):
    examples = sorted((ROOT / "include" / "sinks").glob("*.y*ml"))
    assert examples
    ours = [write(tmp_path, f"{name}.yaml", data) for name, data in (("q", QUERY), ("c", CHANGELOG), ("u", UPSERT))]
    ours.append(write(tmp_path, "from_stem.yaml", variant(CHANGELOG, "name")))  # name and as_of default
    ours.append(write(tmp_path, "plain.yaml", variant(UPSERT, "upsert.delete", **{"upsert.key": "id"})))
    written = configs_the_tests_write(tmp_path / "written")
    assert len(written) == 29, written  # one file per call above (twelve of the fleet)
    for path in examples + ours + written:
        load_file(path)  # valid for the loader...
        assert schema_check(path.read_text()) == [], path  # ...and for an editor with the schema


FULL = {  # every field of each kind present
    "query": variant(
        QUERY,
        catchup=True,
        correction_guard={"max_share": 0.2, "min_rows": 5},
        alert={"lag_minutes": 9},
        **{"query.refresh": "full", "query.full_every": {"batches": 3, "hours": 0}},
    ),
    "changelog": variant(CHANGELOG, description="d", partitions=2, as_of=5, retries=1, read_only=False),
    "upsert": variant(UPSERT, compaction={"every_batches": 0}, retention={"vacuum_hours": 1, "history_hours": 2}),
}


def _object_nodes(data, node: dict, defs: dict, path: tuple = ()):
    """(path, the schema's object node) for every mapping of ``data`` with fields of its own."""

    def resolve(n: dict) -> dict:
        while "$ref" in n or "anyOf" in n:
            n = (
                defs[n["$ref"].split("/")[-1]]
                if "$ref" in n
                else next(m for m in n["anyOf"] if m.get("type") != "null")
            )
        return n

    node = resolve(node)
    if isinstance(data, dict) and "properties" in node:
        yield path, node
        for key, value in data.items():
            yield from _object_nodes(value, node["properties"][key], defs, (*path, key))
    elif isinstance(data, dict) and isinstance(node.get("additionalProperties"), dict):  # query.sources
        for key, value in data.items():
            yield from _object_nodes(value, node["additionalProperties"], defs, (*path, key))
    elif isinstance(data, list) and "items" in node:
        yield from _object_nodes(data[0], node["items"], defs, (*path, 0))


@pytest.mark.parametrize("kind", FULL)
def test_schema_requires_exactly_the_fields_the_loader_requires(tmp_path, kind):
    """At every level of a full config, each field is dropped in turn: the loader says "is
    required" for exactly the fields the schema lists as required."""
    from reconcile.config import json_schema

    schema = json_schema()
    top = schema["$defs"][schema["discriminator"]["mapping"][kind].split("/")[-1]]
    data = FULL[kind]
    sections = set()
    for path, node in _object_nodes(data, top, schema["$defs"]):
        sections.add(path[0] if path else "<root>")
        here = data
        for p in path:
            here = here[p]
        assert set(node.get("required", [])) <= set(here), f"{path}: the full config lacks a required field"
        loader_required = set()
        for key in here:
            dotted = ".".join(str(p) for p in (*path, key))
            field = re.sub(r"\.(\d+)", r"[\1]", dotted)
            try:
                load_file(write(tmp_path, f"{data['name']}.yaml", variant(data, dotted)))
            except ConfigError as exc:
                if any(f"field '{field}': is required" in str(p) for p in problems_of(exc)):
                    loader_required.add(key)
        assert loader_required == set(node.get("required", [])), path
    assert sections >= {"<root>", "schema", kind}


# What only the loader can check: across fields, and cron syntax.
LOADER_ONLY = {
    "reserved _time", "reserved _diff", "reserved any case", "duplicate column", "duplicate column any case",
    "bad schedule", "upsert key not in schema", "upsert key twice", "upsert time column in schema",
    "upsert offset equals time", "upsert delete column in schema", "upsert key-only without delete",
    "upsert empty key", "decimal precision over 38", "decimal scale over precision", "incremental refresh over json",
}  # fmt: skip


def test_schema_refuses_what_the_loader_refuses(schema_check):
    """Each invalid config of CASES: the schema refuses it too, unless only the loader can see it."""
    accepted = set()
    for case, (data, _) in CASES.items():
        text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
        if not schema_check(text):
            accepted.add(case)
    assert accepted == LOADER_ONLY


# --- one-line errors: shortened in the middle, the cause kept ----------------------------------

DEEP = "/data/warehouse/" + "/".join(f"a_really_long_directory_name_{i:02d}" for i in range(10)) + "/orders.json"
LONG_PATHS = {
    "local": (DEEP, "/data/", "/orders.json"),
    "file URI": ("file:" + DEEP, "file:/data/", "/orders.json"),
    "s3": ("s3a://bucket/" + "p=1/" * 80 + "part-00000.parquet", "s3a://bucket/", "/part-00000.parquet"),
    "https with query": (
        "https://acct.blob.core.windows.net/c/" + "/".join(f"d{i}" for i in range(90)) + "/f.json?sv=1&sig=x",
        "https://acct.blob.core.windows.net/",
        "/f.json?sv=1&sig=x",
    ),
    "windows": ("C:\\data\\" + "\\".join(f"folder{i}" for i in range(40)) + "\\x.csv", "C:\\data\\", "\\x.csv"),
    "one long name": ("/tmp/" + "n" * 300, "/tmp/", "n" * 20),
}


@pytest.mark.parametrize("path,start,end", LONG_PATHS.values(), ids=LONG_PATHS.keys())
def test_a_long_path_is_cut_in_its_middle(path, start, end):
    from reconcile.errors import short_path

    assert len(path) > 250
    short = short_path(path)
    assert len(short) <= 80 and short.count("…") == 1, short
    head, tail = short.split("…")
    assert short.startswith(start) and short.endswith(end), short
    assert path.startswith(head) and path.endswith(tail), short  # nothing changed but the middle cut
    assert short_path(short) == short and short_path("/a/b.json") == "/a/b.json"


def test_a_deep_path_keeps_its_root_and_last_components():
    from reconcile.errors import short_path

    assert short_path(DEEP) == "/data/warehouse/…/a_really_long_directory_name_09/orders.json"
    assert short_path("/data/very/" + "deep/" * 100 + "dir/file.json", 26) == "/data/very/…/dir/file.json"


def test_a_shortened_message_keeps_its_start_and_its_cause():
    from reconcile.errors import brief, shorten

    spark = f"\n[PATH_NOT_FOUND] Path does not exist: file:{DEEP}. SQLSTATE: 42K03\n\tat org.apache.Foo(Foo.java:1)"
    for limit in (300, 120):
        text = brief(RuntimeError(spark), limit)
        assert len(text) <= limit and "\n" not in text, text
        assert text.startswith("[PATH_NOT_FOUND] Path does not exist: file:/data/") and "/orders.json" in text, text
    # a chain: what failed first, the root cause (its class and reason) last; long paths cut in the middle
    try:
        try:
            raise FileNotFoundError(2, "No such file or directory", DEEP)
        except OSError as inner:
            raise RuntimeError(f"cannot read source query.sources.orders (json at {DEEP})") from inner
    except RuntimeError as exc:
        text = brief(exc, 300)
    assert len(text) <= 300 and text.startswith("cannot read source query.sources.orders (json at /data/"), text
    assert text.endswith(
        "[Errno 2] No such file or directory: '/data/warehouse/…/a_really_long_directory_name_09/orders.json'"
    )
    # no path to cut: the middle goes, between words; the start and the end stay
    words = " ".join(f"w{i}" for i in range(200))
    cut = shorten(f"the write failed: {words} PERMISSION_DENIED", 100)
    assert len(cut) <= 100 and cut.startswith("the write failed: w0 w1") and cut.endswith("w199 PERMISSION_DENIED")
    assert " … " in cut and all(w in words.split() for w in cut.split()[3:-1] if w != "…")
    assert shorten("fits  as\n it is", 100) == "fits as it is"


def test_a_long_value_in_a_config_is_cut_not_its_field(tmp_path):
    path = write(tmp_path, "orders_daily.yaml", variant(QUERY, partitions="p" * 3000))
    (err,) = load_dir(tmp_path)[1]
    (problem,) = problems_of(err)
    text = str(problem)
    assert "\n" not in text and len(text) < 700, text
    assert text.startswith(f"sink 'orders_daily': config {path}: field 'partitions': ") and "got str 'ppp" in text
    assert text.endswith("ppp' Remedy: fix the named field in the config file; nothing was written."), text


# --- python -m reconcile validate ---------------------------------------------------------------


def test_validate_prints_each_problem_on_its_own_line(tmp_path, capsys):
    from reconcile.cli import main

    good = write(tmp_path, "orders_daily.yaml", QUERY)
    bad = write(tmp_path, "customers.yaml", variant(UPSERT, "upsert.time_column", **{"upsert.time_colum": "ts"}))
    assert main(["validate", "--dir", str(tmp_path), "--no-spark"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"ok      orders_daily (query, 2 columns, P=8, SQL not planned) {good}"
    assert [line.split("field ")[1].split(":")[0] for line in lines[1:]] == [
        "'upsert.time_column'",
        "'upsert.time_colum'",
    ]
    assert all(line.startswith(f"INVALID sink 'customers': config {bad}: field ") for line in lines[1:])


@pytest.mark.slow  # a JVM of its own
def test_validate_plans_query_sql_against_the_sources_schemas(tmp_path):
    """A real JVM: each query sink's SQL is analysed against its sources' schemas; a bad column
    is one line naming the file, query.sql, the column and Spark's suggestion; stderr stays
    empty (no banner, no stack trace)."""
    import json
    import os
    import subprocess
    import sys
    import time

    (tmp_path / "orders").mkdir()
    (tmp_path / "orders" / "part-0.json").write_text(json.dumps({"k": 1, "v": "a", "amount": 2.5}) + "\n")
    source = {"orders": {"format": "json", "path": "orders"}}
    sinks = {
        "good": "SELECT k, v FROM orders",
        "typo": "SELECT k, amout AS v FROM orders",
        "extra": "SELECT k, v, amount FROM orders",
        "undeclared": "SELECT k, v FROM elsewhere",
    }
    paths = {}
    for name, sql in sinks.items():
        data = variant(QUERY, "name", "query.sources", **{"query.sql": sql})
        paths[name] = write(tmp_path, f"{name}.yaml", {**data, "query": {"sources": source, "sql": sql}})
    gone = variant(QUERY, "name", **{"query.sources": {"gone": {"format": "parquet", "path": "nowhere"}}})
    paths["missing"] = write(tmp_path, "missing.yaml", gone)
    # a path of 300+ characters that does not exist: cut in its middle, never its cause (issue 51)
    deep = str(tmp_path / "/".join(f"a_really_long_directory_name_{i:02d}" for i in range(10)) / "orders.json")
    deep_sql = "SELECT k, v FROM orders"
    deep_data = variant(QUERY, "name", **{"query.sources": {"orders": {"format": "json", "path": deep}}})
    paths["deep"] = write(tmp_path, "deep.yaml", {**deep_data, "query": {**deep_data["query"], "sql": deep_sql}})
    write(tmp_path, "ledger.yaml", CHANGELOG)  # not a query: not planned, no source read

    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "reconcile", "validate", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "RECONCILE_SPARK_REMOTE": ""},
        timeout=300,
    )
    took = time.monotonic() - started
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr == "", run.stderr
    out = {line.split()[1].strip("'"): line for line in run.stdout.splitlines() if line.startswith("ok")}
    bad = {line.split("'")[1]: line for line in run.stdout.splitlines() if line.startswith("INVALID")}
    assert set(out) == {"good", "ledger"} and set(bad) == {"typo", "extra", "undeclared", "missing", "deep"}, run.stdout
    assert "SQL planned" in out["good"] and "SQL" not in out["ledger"]
    lines = run.stdout.splitlines()  # it says, before it waits, that it starts a JVM, and then how long it took
    assert lines[0] == (
        "planning the SQL of 6 query sink(s) against their sources with a local Spark JVM (10-30 s to start; "
        "--no-spark skips it)"
    ), lines
    planned = float(re.fullmatch(r"planned in (\d+\.\d) s", lines[1]).group(1))
    assert 0 < planned <= took
    typo = bad["typo"]
    assert f"config {paths['typo']}: field 'query.sql': " in typo
    assert (
        "`amout` cannot be resolved" in typo and "Did you mean one of the following? [" in typo and "`amount`" in typo
    )
    assert f"config {paths['extra']}: field 'query.sql': " in bad["extra"] and "['amount']" in bad["extra"]
    assert "`elsewhere` cannot be found" in bad["undeclared"]
    assert f"config {paths['missing']}: field 'query.sources.gone': " in bad["missing"]
    assert "Path does not exist" in bad["missing"]
    line = bad["deep"]
    assert len(deep) > 300 and len(line) < 700, line
    assert line.startswith(f"INVALID sink 'deep': config {paths['deep']}: field 'query.sources.orders': "), line
    assert "[PATH_NOT_FOUND] Path does not exist: " in line, line  # the cause, Spark's class and words
    end = "…/a_really_long_directory_name_09/orders.json"
    for where in ("(json at ", "Path does not exist: file:"):  # the path's start and end, both times
        assert f"{where}{deep[:20]}" in line and f"{end}" in line.split(where)[1].split()[0], line
    assert line.endswith(" Remedy: fix the named field in the config file; nothing was written."), line
    print(f"validate with 6 query sinks planned in a new JVM: {took:.1f} s")
