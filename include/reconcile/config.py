"""Sink configs: the pydantic models of a sink file, one frozen model per kind.

``kind`` picks the model (:class:`QuerySink`, :class:`ChangelogSink`, :class:`UpsertSink`, all
:class:`SinkConfig`); unknown fields are refused. Identifiers (sink, column and source names)
must be plain names, so nothing in a config can inject SQL or a path. ``python -m reconcile
schema`` prints the JSON schema; it agrees with the loader (``name`` and ``as_of`` have defaults
the loader fills in). Reading the files is :mod:`reconcile.config_loading`'s job, their problems'
messages :mod:`reconcile.config_messages`'.
"""

from __future__ import annotations

import difflib
import os
import re
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from reconcile.model import ROW_KEYS
from reconcile.sql_names import spark_name

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
SINK_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
TYPE_RE = re.compile(
    r"^(boolean|tinyint|smallint|int|integer|bigint|float|double|string|date|timestamp|"
    r"timestamp_ntz|binary|decimal\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\))$"
)
TYPES = (
    "boolean", "tinyint", "smallint", "int", "bigint", "float", "double", "decimal(p,s)", "string", "date",
    "timestamp", "timestamp_ntz", "binary",
)  # fmt: skip
# what other systems call the supported types
TYPE_ALIASES = {
    "bool": "boolean", "byte": "tinyint", "int8": "tinyint", "short": "smallint", "int16": "smallint",
    "int32": "int", "long": "bigint", "int64": "bigint", "real": "float", "float32": "float",
    "float64": "double", "double precision": "double", "decimal": "decimal(p,s)", "numeric": "decimal(p,s)",
    "str": "string", "text": "string", "varchar": "string", "char": "string", "datetime": "timestamp",
    "datetime64": "timestamp", "timestamptz": "timestamp", "bytes": "binary", "blob": "binary",
}  # fmt: skip
KINDS = ("query", "changelog", "upsert")
FORMATS = ("delta", "parquet", "csv", "json")
RESERVED = ("_time", "_diff", "_error", "_part", "reconcile_part", *ROW_KEYS)
SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "none")


class FieldError(ValueError):
    """Problems found by a validator that spans fields, each naming the field it is about."""

    def __init__(self, field: str, message: str, *more: tuple[str, str]):
        super().__init__(message)
        self.field = field
        self.problems = [(field, message), *more]

    @classmethod
    def check(cls, problems: list[tuple[str, str]]) -> None:
        """Raise the problems (``(field, message)``), if any."""
        if problems:
            raise cls(*problems[0], *problems[1:])


def did_you_mean(value: object, options, aliases: dict[str, str] | None = None) -> str:
    """``"; did you mean `time_column`?"`` for the option nearest ``value``, or ``""``."""
    text = str(value).strip().lower()
    guess = (aliases or {}).get(text)
    if guess is None:
        close = difflib.get_close_matches(text, [str(o) for o in options], n=1, cutoff=0.6)
        guess = close[0] if close else None
    return f"; did you mean `{guess}`?" if guess else ""


# -- value types ---------------------------------------------------------------------------------


def _identifier(value: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(
            f"{value!r} is not a plain identifier (letters, digits, underscore; not starting with a digit)"
        )
    return value


def _sink_name(value: str) -> str:
    if not SINK_NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a valid sink name (lowercase letters, digits, underscore)")
    return value


def _spark_type(value: str) -> str:
    value = value.strip().lower()
    if not TYPE_RE.match(value):
        hint = did_you_mean(value, TYPES, TYPE_ALIASES)
        raise ValueError(f"{value!r} is not a supported type{hint} (supported: {', '.join(TYPES)})")
    if value.startswith("decimal"):
        precision, scale = (int(n) for n in re.findall(r"\d+", value))
        if not 1 <= precision <= 38 or scale > precision:
            raise ValueError(f"{value!r}: a decimal's precision is 1 to 38, its scale at most the precision")
    return value


def _to_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):  # a YAML date
        dt = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO-8601 date-time") from None
    else:
        raise ValueError(f"expected an ISO-8601 date-time, got {type(value).__name__}")
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _to_millis(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected epoch milliseconds or an ISO-8601 date-time")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    return int(_to_datetime(value).timestamp() * 1000)


def _any_case(pattern: str) -> str:
    """A regular expression matching what ``pattern`` matches in any letter case (JSON schema
    patterns have no flags)."""
    return re.sub(r"(?<!\\)[a-z]", lambda m: f"[{m[0]}{m[0].upper()}]", pattern)


# The JSON schema of each value type says what the validator accepts, as far as a pattern can.
ISO_PATTERN = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}(:?\d{2})?)?)?$"
_ISO_SCHEMA = {"type": "string", "pattern": ISO_PATTERN, "description": "ISO-8601 date or date-time (UTC if no offset)"}
Identifier = Annotated[
    StrictStr, AfterValidator(_identifier), WithJsonSchema({"type": "string", "pattern": NAME_RE.pattern})
]
SinkName = Annotated[
    StrictStr, AfterValidator(_sink_name), WithJsonSchema({"type": "string", "pattern": SINK_NAME_RE.pattern})
]
SparkType = Annotated[
    StrictStr,
    AfterValidator(_spark_type),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": _any_case(TYPE_RE.pattern.replace("^(", r"^\s*(").replace(")$", r")\s*$")),
            "examples": [t for t in TYPES if t != "decimal(p,s)"] + ["decimal(10,2)"],
        }
    ),
]
NonNegative = Annotated[StrictInt, Field(ge=0)]
DateTime = Annotated[datetime, BeforeValidator(_to_datetime), WithJsonSchema(_ISO_SCHEMA)]
Millis = Annotated[
    int,
    BeforeValidator(_to_millis),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0, "description": "epoch milliseconds"}, _ISO_SCHEMA]}),
]


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Column:
    name: Identifier
    type: SparkType
    nullable: StrictBool = True
    # the column's name in the shard before a rename (issue 52): the next run renames it there
    renamed_from: Identifier | None = None


@dataclass(frozen=True)
class Source:
    """A source as the sink reads it: its name, format, resolved location and options."""

    name: str
    format: str
    path: str
    options: tuple[tuple[str, str], ...] = ()


# -- the YAML's sections -------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _expand(raw: str) -> str:
    """Expand ${VAR} in a path; ${RECONCILE_HOME} defaults to the embedded default's home."""
    from string import Template

    from reconcile import settings

    return Template(raw).safe_substitute({**os.environ, "RECONCILE_HOME": str(settings.home())})


class SourceSpec(_Section):
    format: Literal["delta", "parquet", "csv", "json"]
    path: StrictStr = Field(
        description="a path (relative to the config file) or URI; ${VAR} is expanded",
        json_schema_extra={"pattern": r"\S"},
    )
    options: dict[StrictStr, StrictStr | StrictBool | StrictInt | StrictFloat] = {}

    @field_validator("path")
    @classmethod
    def _location(cls, raw: str, info: ValidationInfo) -> str:
        raw = _expand(raw)
        if "\x00" in raw or not raw.strip():
            raise ValueError("must be a non-empty path or URI")
        if "://" in raw or raw.startswith("/"):
            return raw
        base = Path((info.context or {}).get("base", "."))
        return str((base / raw).resolve())

    def resolved(self, name: str) -> Source:
        opts = tuple(sorted((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in self.options.items()))
        return Source(name, self.format, self.path, opts)


class Retention(_Section):
    vacuum_hours: NonNegative = 168
    history_hours: NonNegative = 168


class Compaction(_Section):
    every_batches: NonNegative = Field(default=20, description="0: compact only by hand")


class CorrectionGuard(_Section):
    max_share: Annotated[StrictFloat | StrictInt, Field(gt=0)] | None = Field(
        default=None,
        description="stop a batch before its append when it would insert or retract more than this share of "
        "the shard's rows (0.2 = 20%); approve it with `python -m reconcile approve SINK BATCH`",
    )
    min_rows: NonNegative = Field(
        default=100, description="the guard applies once the shard holds at least this many rows"
    )
    approve_in_airflow: StrictBool = Field(
        default=False,
        description="a stopped batch waits in the run's `approve_correction` task for an operator to approve or "
        "reject it in Airflow's UI (Required actions), instead of failing the append; the CLI approval stays",
    )
    approval_timeout_minutes: Annotated[StrictFloat | StrictInt, Field(gt=0)] | None = Field(
        default=None,
        description="how long `approve_correction` waits for an answer; then the batch counts as rejected "
        "(nothing committed, the run fails saying how to approve it later); default: the schedule's "
        "interval (a day without a recurring schedule)",
    )


class CurrentSpec(_Section):
    path: StrictStr | None = Field(
        default=None,
        description="where the current-state Delta table lives (a path or URI; ${VAR} is expanded); default: "
        "beside the shard, `<warehouse>/<sink>.current`",
    )
    database: Identifier = Field(
        default="reconcile",
        description="the catalog database both tables are registered in: `<database>.<sink>` (the current state) "
        "and `<database>.<sink>_log` (the shard, the update log)",
    )
    deletion_vectors: StrictBool = Field(
        default=False,
        description="mark retracted rows with Delta deletion vectors (a batch costs its retractions, not the files they "
        "fall in; read by Spark, DuckDB, Polars, Trino and delta-rs's scan/QueryBuilder, not by delta-rs's "
        "to_pyarrow_table/to_pyarrow_dataset/to_pandas nor dbt-duckdb's delta plugin); false (the default, what "
        "every reader reads): rewrite the files they fall in (copy-on-write). On a local disk or S3 (elsewhere "
        "always false); a change is applied by the next append (or `rebuild-current`)",
    )

    @field_validator("path")
    @classmethod
    def _location(cls, raw: str | None, info: ValidationInfo) -> str | None:
        if raw is None:
            return None
        raw = _expand(raw).rstrip("/")
        if "\x00" in raw or not raw.strip():
            raise ValueError("must be a non-empty path or URI")
        if "://" in raw or raw.startswith("/"):
            return raw
        return str((Path((info.context or {}).get("base", ".")) / raw).resolve())


DOTTED_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def _dotted_path(value: str) -> str:
    if not DOTTED_PATH_RE.match(value):
        raise ValueError(
            f"{value!r} is not a dotted path (module.function or module.NotifierClass, importable by Airflow's workers)"
        )
    return value


DottedPath = Annotated[
    StrictStr, AfterValidator(_dotted_path), WithJsonSchema({"type": "string", "pattern": DOTTED_PATH_RE.pattern})
]


class Alert(_Section):
    lag_minutes: NonNegative | None = Field(
        default=None,
        description="the shard pages colour a sink red when its upper lags now by more than this (default: twice "
        "the schedule's interval; none without a recurring schedule); set, it is also the DAG's Airflow deadline: "
        "a run not finished this long after it was queued calls the alert's callback",
    )
    callback: DottedPath | None = Field(
        default=None,
        description="what a missed deadline calls besides logging it: the dotted path of a function (called with "
        "message=, context= and callback_kwargs) or of an Airflow notifier class (built with callback_kwargs, "
        "whose templates see {{ message }})",
    )
    callback_kwargs: dict[StrictStr, StrictStr | StrictInt | StrictFloat | StrictBool] = Field(
        default={}, description="keyword arguments of the callback (e.g. a notifier's connection id and channel)"
    )


class FullEvery(_Section):
    batches: NonNegative = Field(
        default=24,
        description="a batch compares in full when this many batches ran since the last full comparison "
        "(counting itself); 0: not by count",
    )
    hours: NonNegative = Field(
        default=168,
        description="a batch compares in full when its upper is this many hours past the upper of the last full "
        "comparison; 0: not by time",
    )


REFRESH = ("auto", "incremental", "full")


class QuerySpec(_Section):
    sources: dict[Identifier, SourceSpec] = Field(
        default={}, json_schema_extra={"propertyNames": {"pattern": NAME_RE.pattern}}
    )
    sql: StrictStr
    refresh: Literal["auto", "incremental", "full"] = Field(
        default="auto",
        description="auto: a batch is computed from the Delta sources' changes where they determine it, else in full; "
        "incremental: a batch that cannot be fails (first batches, an edited query and full_every's compare in "
        "full); full: every batch compares the whole query result with the shard",
    )
    full_every: FullEvery = Field(
        default=FullEvery(),
        description="the full comparison at least this often (whichever comes first), which repairs what no "
        "change feed said",
    )

    @field_validator("sql")
    @classmethod
    def _not_empty(cls, sql: str) -> str:
        if not sql.strip():
            raise ValueError("must not be empty")
        return sql


class ChangelogSpec(_Section):
    source: SourceSpec
    time_column: Identifier
    diff_column: Identifier


class DeleteSpec(_Section):
    column: Identifier
    values: list[StrictStr | StrictInt] = Field(min_length=1)


class UpsertSpec(_Section):
    source: SourceSpec
    key: StrictStr | list[StrictStr]
    time_column: Identifier
    offset_column: Identifier
    delete: DeleteSpec | None = None


# -- the sinks -----------------------------------------------------------------------------------


def column_name_problems(names: list) -> list[tuple[str, str]]:
    """Reserved and duplicate column names (``(field, message)`` each); not a string: skipped
    (the column's own check names it)."""
    seen: set[str] = set()
    problems = []
    for i, name in enumerate(names):
        if not isinstance(name, str):
            continue
        if name.lower() in RESERVED:
            problems.append((f"schema[{i}].name", f"{name!r} is reserved by the sink ({', '.join(RESERVED)})"))
        elif name.lower() in seen:
            problems.append((f"schema[{i}].name", f"duplicate column {name!r}"))
        seen.add(name.lower())
    return problems


def _also_a_switch(schema: dict[str, Any]) -> None:
    """A section that ``true`` switches on (its defaults) and ``false`` off: the schema says so."""
    schema["anyOf"] = [*schema.get("anyOf", []), {"type": "boolean"}]


class SinkConfig(BaseModel):
    """What every sink has; :class:`QuerySink`, :class:`ChangelogSink` and :class:`UpsertSink`
    add their kind's section."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    name: SinkName
    kind: str
    description: StrictStr = ""
    columns: tuple[Column, ...] = Field(alias="schema", min_length=1)
    partitions: StrictInt = Field(4, ge=1, le=4096)
    schedule: StrictStr | None = Field("@daily", description="cron, a preset, or 'none'")
    start_date: DateTime
    as_of: Millis = Field(description="epoch ms or ISO date-time; default: start_date")
    catchup: StrictBool = False
    retries: NonNegative = 2
    spark_conn_id: StrictStr | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{1,250}$",
        description="the Airflow connection the sink's write and compact tasks run on (a `spark` or `spark_connect` "
        "one); default: RECONCILE_SPARK_CONN_ID, else spark_default",
    )
    read_only: StrictBool = False
    retention: Retention = Retention()
    compaction: Compaction = Compaction()
    correction_guard: CorrectionGuard = CorrectionGuard()
    alert: Alert = Alert()
    current: CurrentSpec | None = Field(
        default=None,
        description="keep a current-state table beside the shard: the collection as of the shard's upper - 1 as "
        "plain rows (no _time/_diff), maintained from each batch's correction; `true` or {path, database}",
        json_schema_extra=_also_a_switch,
    )
    _path: str = PrivateAttr("")

    @field_validator("current", mode="before")
    @classmethod
    def _current_switch(cls, value: Any) -> Any:
        if value is True:
            return {}
        if value is False:
            return None
        return value

    @model_validator(mode="before")
    @classmethod
    def _as_of_defaults_to_start(cls, data: Any) -> Any:
        if isinstance(data, dict) and "as_of" not in data and "start_date" in data:
            data = {**data, "as_of": data["start_date"]}
        return data

    @field_validator("columns")
    @classmethod
    def _distinct_names(cls, columns: tuple[Column, ...]) -> tuple[Column, ...]:
        FieldError.check(column_name_problems([c.name for c in columns]))
        return columns

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is None or value == "none":
            return None
        if value in SCHEDULE_PRESETS or _valid_cron(value):
            return value
        raise ValueError(f"{value!r} is not a valid cron expression or one of {list(SCHEDULE_PRESETS)}")

    def model_post_init(self, context: Any) -> None:
        self._path = str((context or {}).get("path", ""))

    @property
    def path(self) -> str:
        """The config file it was read from."""
        return self._path

    @property
    def base(self) -> Path:
        return Path(self._path).resolve().parent

    @property
    def partition_key(self) -> tuple[str, ...]:
        """The columns the shard's hash partitions hash instead of every column of a row (an
        upsert sink's key: every update of a key in one partition); none for the other kinds."""
        return ()

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def ddl(self) -> str:
        """Spark DDL of the shard's Delta table."""
        cols = [f"{spark_name(c.name)} {c.type}" for c in self.columns]
        return ", ".join(cols + ["`_time` BIGINT", "`_diff` BIGINT", "`_error` STRING"])

    @property
    def vacuum_retention_hours(self) -> int:
        return self.retention.vacuum_hours

    @property
    def history_retention_hours(self) -> int:
        return self.retention.history_hours

    @property
    def compact_every_batches(self) -> int:
        return self.compaction.every_batches


class QuerySink(SinkConfig):
    """A snapshot: a Spark SQL query over named sources, refreshed at each batch's ``upper - 1``."""

    kind: Literal["query"]
    query: QuerySpec

    @model_validator(mode="after")
    def _incremental_needs_delta(self) -> QuerySink:
        if self.query.refresh == "incremental":
            other = [f"{n} ({s.format})" for n, s in self.query.sources.items() if s.format != "delta"]
            if other or not self.query.sources:
                what = f"source {', '.join(other)} is not one" if other else "the query reads none"
                raise FieldError(
                    "query.refresh",
                    f"incremental reads the sources' changes, which Delta tables have, and {what}: make every source "
                    "a Delta table, or set refresh: auto",
                )
        return self

    @property
    def sources(self) -> tuple[Source, ...]:
        return tuple(spec.resolved(name) for name, spec in self.query.sources.items())

    @property
    def sql(self) -> str:
        return self.query.sql


class ChangelogSink(SinkConfig):
    """A change log ``(row, time, diff)``: its history is known and kept as it is."""

    kind: Literal["changelog"]
    changelog: ChangelogSpec

    @property
    def source(self) -> Source:
        return self.changelog.source.resolved("source")

    @property
    def time_column(self) -> str:
        return self.changelog.time_column

    @property
    def diff_column(self) -> str:
        return self.changelog.diff_column


class UpsertSink(SinkConfig):
    """A feed of keyed commands ``(key, value or delete, time, offset)``: one value per key."""

    kind: Literal["upsert"]
    upsert: UpsertSpec

    @model_validator(mode="after")
    def _keys_and_feed_columns(self) -> UpsertSink:
        FieldError.check(upsert_problems([c.name for c in self.columns], self.upsert))
        return self

    @property
    def source(self) -> Source:
        return self.upsert.source.resolved("source")

    @property
    def key_columns(self) -> tuple[str, ...]:
        names = {c.name.lower(): c.name for c in self.columns}
        keys = [self.upsert.key] if isinstance(self.upsert.key, str) else self.upsert.key
        return tuple(names[k.lower()] for k in keys)

    @property
    def partition_key(self) -> tuple[str, ...]:
        return self.key_columns

    @property
    def value_columns(self) -> list[str]:
        """The schema's columns that are not part of the key."""
        keys = {k.lower() for k in ([self.upsert.key] if isinstance(self.upsert.key, str) else self.upsert.key)}
        return [c.name for c in self.columns if c.name.lower() not in keys]

    @property
    def time_column(self) -> str:
        return self.upsert.time_column

    @property
    def offset_column(self) -> str:
        return self.upsert.offset_column

    @property
    def delete_column(self) -> str | None:
        return self.upsert.delete.column if self.upsert.delete else None

    @property
    def delete_values(self) -> tuple[str, ...]:
        return tuple(str(v) for v in self.upsert.delete.values) if self.upsert.delete else ()


def upsert_problems(columns: list[str], u: UpsertSpec) -> list[tuple[str, str]]:
    """What an upsert section says about the schema's columns that cannot hold: ``(field,
    message)`` for each (also checked when other fields of the file are invalid)."""
    names = {c.lower() for c in columns}
    keys = [u.key] if isinstance(u.key, str) else u.key
    problems = []
    if not keys:
        problems.append(("upsert.key", "must name at least one column of the schema"))
    for i, k in enumerate(keys):
        if k.lower() not in names:
            problems.append(
                (f"upsert.key[{i}]", f"{k!r} is not a column of the schema{did_you_mean(k, names)} ({sorted(names)})")
            )
    if len({k.lower() for k in keys}) != len(keys):
        problems.append(("upsert.key", "lists a column twice"))
    for fld, col in (("time_column", u.time_column), ("offset_column", u.offset_column)):
        if col.lower() in names:
            problems.append(
                (
                    f"upsert.{fld}",
                    f"{col!r} is a column of the schema; the command's time and offset are not stored in the shard",
                )
            )
    if u.time_column.lower() == u.offset_column.lower():
        problems.append(("upsert.offset_column", "must differ from time_column"))
    if u.delete is not None:
        if u.delete.column.lower() in names | {u.time_column.lower(), u.offset_column.lower()}:
            problems.append(("upsert.delete.column", f"{u.delete.column!r} must be a column of its own in the feed"))
    elif not names - {k.lower() for k in keys}:
        problems.append(
            (
                "upsert.delete",
                "the schema has no value columns, so a delete cannot be a null value: set delete.column and "
                "delete.values",
            )
        )
    return problems


AnySink = Annotated[QuerySink | ChangelogSink | UpsertSink, Field(discriminator="kind")]
SINK_ADAPTER: TypeAdapter[QuerySink | ChangelogSink | UpsertSink] = TypeAdapter(AnySink)


# Fields the loader fills in before validation (:func:`parse`, ``_as_of_defaults_to_start``):
# required by the model, optional in a file.
DEFAULTED = {
    "name": "the sink and DAG id; default: the file's stem",
    "as_of": "the first time the shard holds: epoch ms or ISO date-time; default: start_date",
}


def json_schema() -> dict:
    """The JSON schema of a sink file (for editors: completion and checks as you type)."""
    schema = SINK_ADAPTER.json_schema(by_alias=True)
    schema["title"] = "Reconcile sink config"
    for kind in KINDS:
        model = schema["$defs"][schema_definition(schema, kind)]
        model["required"] = [f for f in model["required"] if f not in DEFAULTED]
        for f, text in DEFAULTED.items():
            model["properties"][f]["description"] = text
    return schema


def schema_definition(schema: dict, kind: str) -> str:
    """The name of a kind's model among the JSON schema's ``$defs``."""
    return schema["discriminator"]["mapping"][kind].rsplit("/", 1)[-1]


def _valid_cron(expr: str) -> bool:
    if len(expr.split()) != 5:
        return False
    from croniter import croniter

    return bool(croniter.is_valid(expr))
