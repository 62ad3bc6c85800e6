"""Sink configs: one YAML file per sink, validated by pydantic into one frozen model per kind.

``kind`` picks the model (:class:`QuerySink`, :class:`ChangelogSink`, :class:`UpsertSink`, all
:class:`SinkConfig`); unknown fields are refused. Every problem is one
:class:`~reconcile.errors.ConfigError` line naming the file and the field (``schema[1].name``,
``upsert.key[0]``). Identifiers (sink, column and source names) must be plain names, so nothing in
a config can inject SQL or a path. ``python -m reconcile schema`` prints the JSON schema.
"""

from __future__ import annotations

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
KINDS = ("query", "changelog", "upsert")
FORMATS = ("delta", "parquet", "csv", "json")
RESERVED = ("_time", "_diff", "_error", "_part", "reconcile_part")
SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "none")


class FieldError(ValueError):
    """A problem found by a validator that spans fields: names the field it is about."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


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
        raise ValueError(f"{value!r} is not a supported type")
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


Identifier = Annotated[StrictStr, AfterValidator(_identifier)]
SinkName = Annotated[StrictStr, AfterValidator(_sink_name)]
SparkType = Annotated[StrictStr, AfterValidator(_spark_type)]
NonNegative = Annotated[StrictInt, Field(ge=0)]
DateTime = Annotated[datetime, BeforeValidator(_to_datetime)]
Millis = Annotated[int, BeforeValidator(_to_millis)]


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
    path: StrictStr = Field(description="a path (relative to the config file) or URI; ${VAR} is expanded")
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


class Alert(_Section):
    lag_minutes: NonNegative | None = Field(
        default=None,
        description="the shard pages colour a sink red when its upper lags now by more than this; "
        "default: twice the schedule's interval (none without a recurring schedule)",
    )


class QuerySpec(_Section):
    sources: dict[Identifier, SourceSpec] = {}
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
    _path: str = PrivateAttr("")

    @model_validator(mode="before")
    @classmethod
    def _as_of_defaults_to_start(cls, data: Any) -> Any:
        if isinstance(data, dict) and "as_of" not in data and "start_date" in data:
            data = {**data, "as_of": data["start_date"]}
        return data

    @field_validator("columns")
    @classmethod
    def _distinct_names(cls, columns: tuple[Column, ...]) -> tuple[Column, ...]:
        seen: set[str] = set()
        for i, c in enumerate(columns):
            if c.name.lower() in RESERVED:
                raise FieldError(f"schema[{i}].name", f"{c.name!r} is reserved by the sink")
            if c.name.lower() in seen:
                raise FieldError(f"schema[{i}].name", f"duplicate column {c.name!r}")
            seen.add(c.name.lower())
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
    def reads_feed(self) -> bool:
        """Whether the kind reads a command feed (and needs its watermark: the highest offset a
        committed batch read)."""
        return isinstance(self, UpsertSink)

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
        u, names = self.upsert, {c.name.lower(): c for c in self.columns}
        keys = [u.key] if isinstance(u.key, str) else u.key
        if not keys:
            raise FieldError("upsert.key", "must name at least one column of the schema")
        for i, k in enumerate(keys):
            if k.lower() not in names:
                raise FieldError(f"upsert.key[{i}]", f"{k!r} is not a column of the schema ({sorted(names)})")
        if len({k.lower() for k in keys}) != len(keys):
            raise FieldError("upsert.key", "lists a column twice")
        for fld, col in (("time_column", u.time_column), ("offset_column", u.offset_column)):
            if col.lower() in names:
                raise FieldError(
                    f"upsert.{fld}",
                    f"{col!r} is a column of the schema; the command's time and offset are not stored in the shard",
                )
        if u.time_column.lower() == u.offset_column.lower():
            raise FieldError("upsert.offset_column", "must differ from time_column")
        if u.delete is not None:
            if u.delete.column.lower() in names or u.delete.column.lower() in (
                u.time_column.lower(),
                u.offset_column.lower(),
            ):
                raise FieldError("upsert.delete.column", f"{u.delete.column!r} must be a column of its own in the feed")
        elif not self.value_columns:
            raise FieldError(
                "upsert.delete",
                "the schema has no value columns, so a delete cannot be a null value: set delete.column and delete.values",
            )
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


AnySink = Annotated[QuerySink | ChangelogSink | UpsertSink, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[QuerySink | ChangelogSink | UpsertSink] = TypeAdapter(AnySink)


def json_schema() -> dict:
    """The JSON schema of a sink file (for editors: completion and checks as you type)."""
    schema = _ADAPTER.json_schema(by_alias=True)
    schema["title"] = "Reconcile sink config"
    return schema


def _valid_cron(expr: str) -> bool:
    if len(expr.split()) != 5:
        return False
    from croniter import croniter

    return bool(croniter.is_valid(expr))


# -- errors: one line, naming the file and the field ---------------------------------------------


_UNION_MEMBER = re.compile(r"^(str|int|bool|float|none|list\[.*\]|dict\[.*\]|[a-z-]+\[.*\])$")


def _field(loc: tuple) -> str:
    """``('schema', 1, 'name')`` -> ``schema[1].name`` (without pydantic's ``[key]`` and union
    member labels)."""
    out = ""
    for part in loc:
        if part == "[key]" or (isinstance(part, str) and _UNION_MEMBER.match(part)):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _config_error(exc: ValidationError, path: str, sink: str | None) -> ConfigError:
    err = exc.errors()[0]
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        got = ctx.get("tag")
        why = "is required" if kind == "union_tag_not_found" else f"{got!r} is not one of {list(KINDS)}"
        return ConfigError(path, "kind", why, sink=sink)
    loc = loc[1:]  # the first element is the kind picked by the discriminator
    cause = ctx.get("error")
    if isinstance(cause, FieldError):
        return ConfigError(path, cause.field, str(cause), sink=sink)
    if kind == "missing":
        message = "is required"
    elif kind == "extra_forbidden":
        message = "unknown field (`python -m reconcile schema` lists the allowed ones)"
    elif isinstance(cause, ValueError):
        message = str(cause)
    else:
        message = f"{err['msg']}, got {type(err['input']).__name__} {err['input']!r}"
    return ConfigError(path, _field(loc), " ".join(message.split()), sink=sink)


def parse(data: Any, path: str, default_name: str | None = None) -> SinkConfig:
    """Validate one config mapping. ``path`` names the file in messages."""
    if not isinstance(data, dict):
        raise ConfigError(path, "<root>", "expected a mapping")
    if "name" not in data:
        if not SINK_NAME_RE.match(default_name or ""):
            raise ConfigError(path, "name", f"file stem {default_name!r} is not a valid sink name; set 'name'")
        data = {**data, "name": default_name}
    sink = data["name"] if isinstance(data.get("name"), str) else None
    context = {"path": path, "base": str(Path(path).resolve().parent)}
    try:
        return _ADAPTER.validate_python(data, context=context)
    except ValidationError as exc:
        raise _config_error(exc, path, sink) from None


def load_file(path: Path | str) -> SinkConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), "<file>", "does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "<file>", f"is not valid YAML: {' '.join(str(exc).split())}") from None
    return parse(data, str(path), default_name=path.stem)


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
