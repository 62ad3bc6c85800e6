"""Sink configs: one YAML file per sink, validated into a frozen :class:`SinkConfig`.

Every problem is reported as a :class:`~reconcile.errors.ConfigError` naming the file and the
field. Identifiers (sink, column and source names) must be plain names so that nothing in a
config can inject SQL or a path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from reconcile.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
SINK_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
TYPE_RE = re.compile(
    r"^(boolean|tinyint|smallint|int|integer|bigint|float|double|string|date|timestamp|"
    r"timestamp_ntz|binary|decimal\(\s*\d{1,2}\s*,\s*\d{1,2}\s*\))$"
)
KINDS = ("query", "changelog", "upsert")
FORMATS = ("delta", "parquet", "csv", "json")
RESERVED = ("_time", "_diff", "_error", "_part")
SCHEDULE_PRESETS = ("@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "none")


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class Source:
    name: str
    format: str
    path: str
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SinkConfig:
    name: str
    kind: str
    columns: tuple[Column, ...]
    partitions: int
    schedule: str | None
    start_date: datetime
    as_of: int
    path: str
    catchup: bool = False
    retries: int = 2
    read_only: bool = False
    # query
    sources: tuple[Source, ...] = ()
    sql: str | None = None
    # changelog
    source: Source | None = None
    time_column: str | None = None
    diff_column: str | None = None
    # upsert (source and time_column shared with changelog)
    key_columns: tuple[str, ...] = ()
    offset_column: str | None = None
    delete_column: str | None = None
    delete_values: tuple[str, ...] = ()
    vacuum_retention_hours: int = 168
    history_retention_hours: int = 168
    compact_every_batches: int = 20
    description: str = ""

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def value_columns(self) -> list[str]:
        """Upsert sinks: the schema's columns that are not part of the key."""
        keys = {k.lower() for k in self.key_columns}
        return [c.name for c in self.columns if c.name.lower() not in keys]

    @property
    def ddl(self) -> str:
        """Spark DDL of the shard's Delta table."""
        cols = [f"`{c.name}` {c.type}" for c in self.columns]
        return ", ".join(cols + ["`_time` BIGINT", "`_diff` BIGINT", "`_error` STRING"])


def to_millis(value: Any, path: str, fld: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(path, fld, "expected epoch milliseconds or an ISO-8601 date-time")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(path, fld, "must not be negative")
        return value
    dt = to_datetime(value, path, fld)
    return int(dt.timestamp() * 1000)


def to_datetime(value: Any, path: str, fld: str) -> datetime:
    if isinstance(value, datetime):
        dt = value
    elif hasattr(value, "isoformat") and not isinstance(value, str):  # a YAML date
        dt = datetime.fromisoformat(value.isoformat())
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(path, fld, f"{value!r} is not an ISO-8601 date-time") from None
    else:
        raise ConfigError(path, fld, f"expected an ISO-8601 date-time, got {type(value).__name__}")
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _valid_cron(expr: str) -> bool:
    if len(expr.split()) != 5:
        return False
    from croniter import croniter

    return bool(croniter.is_valid(expr))


class _Reader:
    """Typed access to one mapping of a config file, with errors naming file and field."""

    def __init__(self, path: str, data: Any, prefix: str = ""):
        self.path, self.prefix = path, prefix
        if not isinstance(data, dict):
            raise ConfigError(path, prefix or "<root>", "expected a mapping")
        self.data = data

    def _f(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, typ: type | tuple[type, ...], default: Any = ..., *, required: bool = False):
        if key not in self.data or self.data[key] is None:
            if required or default is ...:
                raise ConfigError(self.path, self._f(key), "is required")
            return default
        value = self.data[key]
        if typ is int and isinstance(value, bool) or not isinstance(value, typ):
            names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise ConfigError(self.path, self._f(key), f"expected {names}, got {type(value).__name__} {value!r}")
        return value

    def name(self, key: str, *, regex: re.Pattern = NAME_RE) -> str:
        value = self.get(key, str, required=True)
        if not regex.match(value):
            raise ConfigError(
                self.path,
                self._f(key),
                f"{value!r} is not a plain identifier (letters, digits, underscore; not starting with a digit)",
            )
        return value

    def sub(self, key: str) -> _Reader:
        return _Reader(self.path, self.get(key, dict, required=True), self._f(key))

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(set(self.data) - allowed)
        if extra:
            raise ConfigError(self.path, self._f(extra[0]), f"unknown field; allowed: {sorted(allowed)}")


def _expand(raw: str) -> str:
    """Expand ${VAR} in a path; ${RECONCILE_HOME} defaults to the embedded default's home."""
    from string import Template

    from reconcile import settings

    return Template(raw).safe_substitute({**os.environ, "RECONCILE_HOME": str(settings.home())})


def _source(r: _Reader, name: str, base: Path) -> Source:
    r.unknown({"format", "path", "options"})
    fmt = r.get("format", str, required=True)
    if fmt not in FORMATS:
        raise ConfigError(r.path, r._f("format"), f"{fmt!r} is not one of {list(FORMATS)}")
    raw = _expand(r.get("path", str, required=True))
    if "\x00" in raw or not raw.strip():
        raise ConfigError(r.path, r._f("path"), "must be a non-empty path or URI")
    if "://" in raw or raw.startswith("/"):
        location = raw
    else:
        location = str((base / raw).resolve())
    options = r.get("options", dict, {})
    for k, v in options.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, bool, float)):
            raise ConfigError(r.path, r._f(f"options.{k}"), "options are string keys to scalars")
    return Source(
        name,
        fmt,
        location,
        tuple(sorted((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in options.items())),
    )


def _upsert(u: _Reader, base: Path, columns: list[Column], sink: str) -> dict[str, Any]:
    """The ``upsert:`` section: a feed of keyed commands (key, value or delete, time, offset)."""
    u.unknown({"source", "key", "time_column", "offset_column", "delete"})
    names = {c.name.lower(): c for c in columns}
    keys = u.get("key", (list, str), required=True)
    keys = [keys] if isinstance(keys, str) else keys
    if not keys:
        raise ConfigError(u.path, "upsert.key", "must name at least one column of the schema", sink=sink)
    for i, k in enumerate(keys):
        if not isinstance(k, str) or k.lower() not in names:
            raise ConfigError(
                u.path, f"upsert.key[{i}]", f"{k!r} is not a column of the schema ({sorted(names)})", sink=sink
            )
    if len({k.lower() for k in keys}) != len(keys):
        raise ConfigError(u.path, "upsert.key", "lists a column twice", sink=sink)
    time_col, offset_col = u.name("time_column"), u.name("offset_column")
    for fld, col in (("time_column", time_col), ("offset_column", offset_col)):
        if col.lower() in names:
            raise ConfigError(
                u.path,
                f"upsert.{fld}",
                f"{col!r} is a column of the schema; the command's time and offset are not stored in the shard",
                sink=sink,
            )
    if time_col.lower() == offset_col.lower():
        raise ConfigError(u.path, "upsert.offset_column", "must differ from time_column", sink=sink)
    kw: dict[str, Any] = dict(
        source=_source(u.sub("source"), "source", base),
        key_columns=tuple(names[k.lower()].name for k in keys),
        time_column=time_col,
        offset_column=offset_col,
    )
    values = [c for c in columns if c.name.lower() not in {k.lower() for k in keys}]
    if "delete" in u.data:
        d = u.sub("delete")
        d.unknown({"column", "values"})
        dcol = d.name("column")
        if dcol.lower() in names or dcol.lower() in (time_col.lower(), offset_col.lower()):
            raise ConfigError(
                u.path, "upsert.delete.column", f"{dcol!r} must be a column of its own in the feed", sink=sink
            )
        dvals = d.get("values", list, required=True)
        if not dvals or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in dvals):
            raise ConfigError(
                u.path, "upsert.delete.values", "must list the strings or integers that mark a delete", sink=sink
            )
        kw.update(delete_column=dcol, delete_values=tuple(str(v) for v in dvals))
    elif not values:
        raise ConfigError(
            u.path,
            "upsert.delete",
            "the schema has no value columns, so a delete cannot be a null value: set delete.column and delete.values",
            sink=sink,
        )
    return kw


TOP_FIELDS = {
    "name",
    "kind",
    "description",
    "schema",
    "partitions",
    "schedule",
    "start_date",
    "as_of",
    "catchup",
    "retries",
    "read_only",
    "query",
    "changelog",
    "upsert",
    "retention",
    "compaction",
}


def parse(data: Any, path: str, default_name: str | None = None) -> SinkConfig:
    """Validate one config mapping. ``path`` names the file in messages."""
    r = _Reader(path, data)
    r.unknown(TOP_FIELDS)
    if "name" in r.data:
        name = r.name("name", regex=SINK_NAME_RE)
    else:
        name = default_name or ""
        if not SINK_NAME_RE.match(name):
            raise ConfigError(path, "name", f"file stem {name!r} is not a valid sink name; set 'name'")
    kind = r.get("kind", str, required=True)
    if kind not in KINDS:
        raise ConfigError(path, "kind", f"{kind!r} is not one of {list(KINDS)}", sink=name)

    schema = r.get("schema", list, required=True)
    if not schema:
        raise ConfigError(path, "schema", "must list at least one column", sink=name)
    columns: list[Column] = []
    seen: set[str] = set()
    for i, raw in enumerate(schema):
        c = _Reader(path, raw, f"schema[{i}]")
        c.unknown({"name", "type", "nullable"})
        cname = c.name("name")
        if cname.lower() in RESERVED:
            raise ConfigError(path, f"schema[{i}].name", f"{cname!r} is reserved by the sink")
        if cname.lower() in seen:
            raise ConfigError(path, f"schema[{i}].name", f"duplicate column {cname!r}")
        seen.add(cname.lower())
        ctype = c.get("type", str, required=True).strip().lower()
        if not TYPE_RE.match(ctype):
            raise ConfigError(path, f"schema[{i}].type", f"{ctype!r} is not a supported type")
        columns.append(Column(cname, ctype, c.get("nullable", bool, True)))

    partitions = r.get("partitions", int, 4)
    if not 1 <= partitions <= 4096:
        raise ConfigError(path, "partitions", "must be between 1 and 4096", sink=name)
    schedule = r.get("schedule", str, "@daily")
    if schedule == "none":
        schedule = None
    elif not (schedule in SCHEDULE_PRESETS or _valid_cron(schedule)):
        raise ConfigError(
            path, "schedule", f"{schedule!r} is not a valid cron expression or one of {list(SCHEDULE_PRESETS)}"
        )
    start = to_datetime(r.get("start_date", (str, datetime, object), required=True), path, "start_date")
    as_of = to_millis(r.data.get("as_of", start), path, "as_of")
    retries = r.get("retries", int, 2)
    if retries < 0:
        raise ConfigError(path, "retries", "must not be negative", sink=name)
    retention = r.get("retention", dict, {})
    rr = _Reader(path, retention, "retention")
    rr.unknown({"vacuum_hours", "history_hours"})
    vacuum = rr.get("vacuum_hours", int, 168)
    if vacuum < 0:
        raise ConfigError(path, "retention.vacuum_hours", "must not be negative", sink=name)
    history = rr.get("history_hours", int, 168)
    if history < 0:
        raise ConfigError(path, "retention.history_hours", "must not be negative", sink=name)
    compaction = _Reader(path, r.get("compaction", dict, {}), "compaction")
    compaction.unknown({"every_batches"})
    every = compaction.get("every_batches", int, 20)
    if every < 0:
        raise ConfigError(path, "compaction.every_batches", "must not be negative (0: compact only by hand)", sink=name)

    base = Path(path).resolve().parent
    kw: dict[str, Any] = {}
    if kind == "query":
        q = r.sub("query")
        q.unknown({"sources", "sql"})
        srcs = q.get("sources", dict, {})
        sources = []
        for sname, sdef in srcs.items():
            if not isinstance(sname, str) or not NAME_RE.match(sname):
                raise ConfigError(path, f"query.sources.{sname}", "source names must be plain identifiers")
            sources.append(_source(_Reader(path, sdef, f"query.sources.{sname}"), sname, base))
        sql = q.get("sql", str, required=True)
        if not sql.strip():
            raise ConfigError(path, "query.sql", "must not be empty")
        kw.update(sources=tuple(sources), sql=sql)
    elif kind == "changelog":
        c = r.sub("changelog")
        c.unknown({"source", "time_column", "diff_column"})
        kw.update(
            source=_source(c.sub("source"), "source", base),
            time_column=c.name("time_column"),
            diff_column=c.name("diff_column"),
        )
    else:
        kw.update(_upsert(r.sub("upsert"), base, columns, name))

    return SinkConfig(
        name=name,
        kind=kind,
        columns=tuple(columns),
        partitions=partitions,
        schedule=schedule,
        start_date=start,
        as_of=as_of,
        path=str(path),
        catchup=r.get("catchup", bool, False),
        retries=retries,
        read_only=r.get("read_only", bool, False),
        vacuum_retention_hours=vacuum,
        history_retention_hours=history,
        compact_every_batches=every,
        description=r.get("description", str, ""),
        **kw,
    )


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
