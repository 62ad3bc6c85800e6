"""Sink configs: one YAML file per sink, validated by pydantic into one frozen model per kind.

``kind`` picks the model (:class:`QuerySink`, :class:`ChangelogSink`, :class:`UpsertSink`, all
:class:`SinkConfig`); unknown fields are refused. Every problem is one
:class:`~reconcile.errors.ConfigError` line naming the file and the field (``schema[1].name``,
``upsert.key[0]``), and a file's problems are reported together (:class:`ConfigErrors`): an
unknown field with the nearest allowed name, a value outside a closed set with the allowed
values, a YAML 1.1 boolean (``off``, ``no``) or number where text belongs with the advice to
quote it. Identifiers (sink, column and source names) must be plain names, so nothing in a
config can inject SQL or a path. ``python -m reconcile schema`` prints the JSON schema; it
agrees with the loader (``name`` and ``as_of`` have defaults the loader fills in).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
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
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass

from reconcile.errors import ConfigError

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
RESERVED = ("_time", "_diff", "_error", "_part", "reconcile_part")
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


class QuerySpec(_Section):
    sources: dict[Identifier, SourceSpec] = Field(
        default={}, json_schema_extra={"propertyNames": {"pattern": NAME_RE.pattern}}
    )
    sql: StrictStr

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
    read_only: StrictBool = False
    retention: Retention = Retention()
    compaction: Compaction = Compaction()
    correction_guard: CorrectionGuard = CorrectionGuard()
    alert: Alert = Alert()
    current: CurrentSpec | None = Field(
        default=None,
        description="keep a current-state table beside the shard: the collection as of the shard's upper - 1 as "
        "plain rows (no _time/_diff), maintained from each batch's correction; `true` or {path, database}",
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
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def ddl(self) -> str:
        """Spark DDL of the shard's Delta table."""
        cols = [f"`{c.name}` {c.type}" for c in self.columns]
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
_ADAPTER: TypeAdapter[QuerySink | ChangelogSink | UpsertSink] = TypeAdapter(AnySink)


# Fields the loader fills in before validation (:func:`parse`, ``_as_of_defaults_to_start``):
# required by the model, optional in a file.
DEFAULTED = {
    "name": "the sink and DAG id; default: the file's stem",
    "as_of": "the first time the shard holds: epoch ms or ISO date-time; default: start_date",
}


def json_schema() -> dict:
    """The JSON schema of a sink file (for editors: completion and checks as you type)."""
    schema = _ADAPTER.json_schema(by_alias=True)
    schema["title"] = "Reconcile sink config"
    for kind in KINDS:
        model = schema["$defs"][_definition(schema, kind)]
        model["required"] = [f for f in model["required"] if f not in DEFAULTED]
        for f, text in DEFAULTED.items():
            model["properties"][f]["description"] = text
    return schema


@functools.cache
def _schema() -> dict:
    return json_schema()


def _definition(schema: dict, kind: str) -> str:
    return schema["discriminator"]["mapping"][kind].rsplit("/", 1)[-1]


def _valid_cron(expr: str) -> bool:
    if len(expr.split()) != 5:
        return False
    from croniter import croniter

    return bool(croniter.is_valid(expr))


# -- errors: one line each, naming the file and the field -------------------------------------


class ConfigErrors(ConfigError):
    """Every problem of one config file: ``problems`` holds one :class:`ConfigError` per field
    (``path``, ``field`` and ``sink`` are the first's); ``str()`` is their lines."""

    def __init__(self, problems: list[ConfigError]):
        assert problems, "a ConfigErrors without problems"
        first = problems[0]
        self.problems = list(problems)
        self.path, self.field, self.sink, self.remedy = first.path, first.field, first.sink, first.remedy
        Exception.__init__(self, "\n".join(str(p) for p in problems))


def problems_of(err: ConfigError) -> list[ConfigError]:
    """The one-line problems of a config error (one, or every problem of a file)."""
    return list(err.problems) if isinstance(err, ConfigErrors) else [err]


_UNION_MEMBER = re.compile(r"^(str|int|bool|float|none|list\[.*\]|dict\[.*\]|[a-z-]+\[.*\])$")
_YAML_WORDS = {bool: "a boolean", int: "a number", float: "a number", date: "a date", datetime: "a date-time"}


def _clean(loc: tuple) -> tuple:
    """A pydantic location without its ``[key]`` and union member labels."""
    return tuple(p for p in loc if not (p == "[key]" or (isinstance(p, str) and _UNION_MEMBER.match(p))))


def _field(loc: tuple) -> str:
    """``('schema', 1, 'name')`` -> ``schema[1].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _allowed(kind: str | None, parent: tuple) -> list[str]:
    """The fields the JSON schema allows at ``parent`` of a ``kind`` sink (any kind's if None)."""
    schema = _schema()
    defs = schema["$defs"]
    if kind is None:
        return sorted({f for k in KINDS for f in defs[_definition(schema, k)]["properties"]})

    def resolve(node: dict) -> dict:
        while True:
            if "$ref" in node:
                node = defs[node["$ref"].rsplit("/", 1)[-1]]
            elif "anyOf" in node:
                node = next((m for m in node["anyOf"] if m.get("type") != "null"), {})
            else:
                return node

    node = resolve(defs[_definition(schema, kind)])
    for part in parent:
        if isinstance(part, int):
            node = resolve(node.get("items", {}))
        elif part in node.get("properties", {}):
            node = resolve(node["properties"][part])
        elif isinstance(node.get("additionalProperties"), dict):
            node = resolve(node["additionalProperties"])
        else:
            return []
    return list(node.get("properties", {}))


def _spelling(text: str | None, loc: tuple) -> str | None:
    """The scalar at ``loc`` as the YAML file spells it (``off`` for a boolean false)."""
    if text is None:
        return None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return None
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _message(err: Any, loc: tuple, kind: str | None, siblings: dict[tuple, list[str]], text: str | None) -> str:
    """One problem's message, saying what to write instead where the loader knows."""
    typ, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    cause = ctx.get("error")
    if typ == "missing":
        near = [f for f in siblings.get(loc[:-1], []) if did_you_mean(f, [loc[-1]])]
        return "is required" + (f" (the file has `{near[0]}`: misspelled?)" if near else "")
    if typ == "extra_forbidden":
        allowed = _allowed(kind, loc[:-1])
        other = [k for k in KINDS if k != kind and loc == (k,)]
        if other:
            return f"is the section of kind '{other[0]}'; this sink's kind is '{kind}' (a sink has one kind's section)"
        return (
            f"unknown field{did_you_mean(loc[-1], allowed)} (allowed here: {', '.join(allowed)}; "
            "`python -m reconcile schema` lists them all)"
        )
    if typ in ("string_type", "literal_error") and type(got) in _YAML_WORDS:
        as_written = _spelling(text, loc) or str(got)
        why = " (YAML 1.1 reads yes/no/on/off/true/false as booleans)" if isinstance(got, bool) else ""
        return f"YAML reads `{as_written}` as {_YAML_WORDS[type(got)]}, not text{why}: quote it, '{as_written}'"
    if typ == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if typ == "bool_type":
        return f"expected true or false, got {type(got).__name__} {got!r}"
    if typ == "literal_error":
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"{got!r} is not one of {', '.join(options)}{did_you_mean(got, options)}"
    if isinstance(cause, ValueError):
        return str(cause)
    return f"{err['msg']}, got {type(got).__name__} {got!r}"


def _kind_problem(tag: Any, data: dict, text: str | None) -> str:
    kinds = ", ".join(KINDS)
    got = data.get("kind")
    if tag["type"] == "union_tag_not_found":
        return f"is required ({kinds}: it picks the sink's section)"
    if isinstance(got, bool):
        as_written = _spelling(text, ("kind",)) or str(got)
        return f"YAML reads `{as_written}` as a boolean, not text: one of {kinds}"
    return f"{got!r} is not one of {kinds}{did_you_mean(got, KINDS)}"


def _problems(
    exc: ValidationError, data: dict, path: str, sink: str | None, text: str | None, context: dict
) -> list[ConfigError]:
    """Every problem of a file as one ConfigError each; one per field (a union's members, a
    list whose items failed: the innermost problem)."""
    errors = exc.errors()
    tag = next((e for e in errors if e["type"] in ("union_tag_not_found", "union_tag_invalid")), None)
    found: dict[str, str] = {}
    kind: str | None = str(data.get("kind"))
    if tag is None:
        located = [(_clean(tuple(e["loc"])[1:]), e) for e in errors]  # loc[0]: the kind the discriminator picked
    else:  # no kind to pick a model: the fields every kind has, and the unknown ones
        kind = None
        found["kind"] = _kind_problem(tag, data, text)
        allowed = _allowed(None, ())
        for key in data:
            if key not in allowed:
                found[str(key)] = f"unknown field{did_you_mean(key, allowed)} (allowed: {', '.join(allowed)})"
        common = [f.alias or name for name, f in SinkConfig.model_fields.items()]
        try:
            SinkConfig.model_validate({**{k: v for k, v in data.items() if k in common}, "kind": "-"}, context=context)
            located = []
        except ValidationError as inner:
            located = [(_clean(tuple(e["loc"])), e) for e in inner.errors()]
    siblings: dict[tuple, list[str]] = {}
    for loc, e in located:
        if e["type"] == "extra_forbidden":
            siblings.setdefault(loc[:-1], []).append(str(loc[-1]))
    for loc, e in located:
        if any(other[: len(loc)] == loc and len(other) > len(loc) for other, _ in located):
            continue  # a container whose items are reported
        if loc == ("as_of",) and e["type"] == "missing":
            continue  # it defaults to start_date, which is reported missing
        cause = (e.get("ctx") or {}).get("error")
        pairs = (
            cause.problems if isinstance(cause, FieldError) else [(_field(loc), _message(e, loc, kind, siblings, text))]
        )
        for fld, message in pairs:
            found.setdefault(fld, " ".join(message.split()))
    for fld, message in _raw_problems(data):  # checks that other fields' problems kept from running
        found.setdefault(fld, message)
    return [ConfigError(path, fld, message, sink=sink) for fld, message in found.items()]


def _raw_problems(data: dict) -> list[tuple[str, str]]:
    """The checks across fields, on the file's own values: a model runs them only when every
    field is valid, and a file's problems are reported together."""
    raw = data.get("schema")
    names = [c.get("name") for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
    problems = column_name_problems(names)
    if data.get("kind") == "upsert" and names:
        try:
            spec = UpsertSpec.model_validate(data.get("upsert"), context={"base": "."})
        except ValidationError:
            return problems
        problems += upsert_problems([n for n in names if isinstance(n, str)], spec)
    return problems


def parse(data: Any, path: str, default_name: str | None = None, text: str | None = None) -> SinkConfig:
    """Validate one config mapping. ``path`` names the file in messages; ``text`` (the file as
    written) lets a message quote a value as the file spells it."""
    if not isinstance(data, dict):
        raise ConfigError(path, "<root>", "expected a mapping")
    problems = []
    if "name" not in data:
        if SINK_NAME_RE.match(default_name or ""):
            data = {**data, "name": default_name}
        else:
            why = f"file stem {default_name!r} is not a valid sink name; set 'name'"
            problems.append(ConfigError(path, "name", why))
    sink = data["name"] if isinstance(data.get("name"), str) and SINK_NAME_RE.match(data["name"]) else None
    context = {"path": path, "base": str(Path(path).resolve().parent)}
    try:
        cfg = _ADAPTER.validate_python(data, context=context)
    except ValidationError as exc:
        seen = {p.field for p in problems}
        problems += [p for p in _problems(exc, data, path, sink, text, context) if p.field not in seen]
    else:
        if not problems:
            return cfg
    raise ConfigErrors(problems)


def load_file(path: Path | str) -> SinkConfig:
    path = Path(path)
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise ConfigError(str(path), "<file>", "does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "<file>", f"is not valid YAML: {' '.join(str(exc).split())}") from None
    return parse(data, str(path), default_name=path.stem, text=text)


def load_dir(directory: Path | str | None = None) -> tuple[list[SinkConfig], list[ConfigError]]:
    """All sink configs of a folder: (valid configs, errors of the invalid files)."""
    from reconcile import settings

    directory = Path(directory) if directory else settings.sinks_dir()
    configs: list[SinkConfig] = []
    errors: list[ConfigError] = []
    names: dict[str, str] = {}
    for path in sorted(directory.glob("*.y*ml")):
        try:
            cfg = load_file(path)
        except ConfigError as exc:
            errors.append(exc)
            continue
        if cfg.name in names:
            errors.append(ConfigError(str(path), "name", f"sink {cfg.name!r} is also defined in {names[cfg.name]}"))
            continue
        names[cfg.name] = str(path)
        configs.append(cfg)
    return configs, errors


def load_sink(name: str, directory: Path | str | None = None) -> SinkConfig:
    configs, errors = load_dir(directory)
    for cfg in configs:
        if cfg.name == name:
            return cfg
    for err in errors:
        if Path(err.path).stem == name:
            raise err
    raise ConfigError(str(directory or "RECONCILE_SINKS_DIR"), "name", f"no sink named {name!r}")
