"""A sink file's schema against its shard's (issue 52): what the next run would do when they differ.

The shard's Delta schema is the sink's columns, then ``_time``, ``_diff``, ``_error`` and the row
key (:meth:`reconcile.storage.delta.ShardTable._columns`). :func:`plan` compares the sink file's
columns with the table's and names each change: a column **added**, **widened** (a numeric type
that holds every value of the old one), **dropped**, **renamed** (declared on the column with
``renamed_from: <old name>``: without it a rename reads as a drop and an add), **retyped** (any
other type change) or **reordered**. :func:`who_changed` tells the sink file's change (the table's
schema is the one the sink's own commits set) from a change made to the table behind the sink's
back (a foreign commit set it). Pure functions over ``(name, Delta type)`` lists, plus one log walk.

What a run applies (:attr:`SchemaPlan.supported`): a nullable column added, whose batch commits
the new schema and the correction it implies in one Delta version (rows written before read the
column as null; Spark's ``xxhash64`` skips null values, so every stored row key and carried
checksum stays the row's: nothing is rewritten); a numeric widening, a drop, a rename or a
reordering, which change every row's key: the batch's write stages the shard's files rewritten
into the new schema with fresh keys beside its correction, and its append commits both, the new
schema and every old file removed, in one Delta version (:mod:`reconcile.sink.evolve`). Refused:
any other type change, a column added ``nullable: false``, an upsert key's change (remedy: a new
sink): a key column added, retyped or renamed, and, on a shard that records its key (the Delta
field metadata ``reconcile_upsert_key`` of each key column: every upsert shard created since;
an older one records it in its next batch's commit), any change of ``upsert.key``, a key column
dropped with it included.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from reconcile.config import SinkConfig
from reconcile.model import ROW_KEYS

SHARD_COLUMNS = ("_time", "_diff", "_error", *ROW_KEYS)  # the table's own, after the sink's columns

_INTEGRAL = ("byte", "short", "integer", "long")
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")

ADDED, WIDENED, DROPPED, RENAMED, RETYPED, REORDERED = "added", "widened", "dropped", "renamed", "retyped", "reordered"
KEY = "key"  # an upsert sink's key changed (``old``/``new``: the shard's key and the file's)
KEY_META = "reconcile_upsert_key"  # the Delta field metadata that marks an upsert shard's key column


def widens(old: str, new: str) -> bool:
    """Whether Delta type ``new`` holds every value of ``old`` exactly: byte < short < integer <
    long, float < double, decimal(p, s) to decimal(p', s') with s' >= s and p' - s' >= p - s."""
    if old in _INTEGRAL and new in _INTEGRAL:
        return _INTEGRAL.index(new) > _INTEGRAL.index(old)
    if (old, new) == ("float", "double"):
        return True
    a, b = _DECIMAL.match(old), _DECIMAL.match(new)
    if a and b:
        (p, s), (q, t) = (int(a[1]), int(a[2])), (int(b[1]), int(b[2]))
        return (q, t) != (p, s) and t >= s and q - t >= p - s
    return False


@dataclass(frozen=True)
class Change:
    what: str  # ADDED, WIDENED, ...
    column: str
    old: str | None = None  # the old type (widened, retyped), the old name (renamed)
    new: str | None = None  # the new type (added, widened, retyped)
    nullable: bool = True  # of an added column
    key: bool = False  # an upsert sink's key column

    def text(self) -> str:
        if self.what == ADDED:
            return f"column {self.column} {self.new} added" + ("" if self.nullable else " (nullable: false)")
        if self.what in (WIDENED, RETYPED):
            return f"column {self.column} {self.what} from {self.old} to {self.new}"
        if self.what == RENAMED:
            return f"column {self.old} renamed to {self.column}"
        if self.what == REORDERED:
            return f"columns reordered ({self.new})"
        if self.what == KEY:
            return f"upsert.key changed from [{self.old}] (the shard's) to [{self.new}]"
        return f"column {self.column} dropped"

    @property
    def problem(self) -> str | None:
        """Why a run refuses this change (None: it applies it)."""
        if self.key:
            return "changes the upsert key (each key's history would change meaning): a new sink"
        if self.what == ADDED:
            return None if self.nullable else "a column added to rows already written must be nullable"
        if self.what == RETYPED:
            return "only numeric widening keeps every value"
        return None  # widened, dropped, renamed, reordered: the shard's files rewritten

    @property
    def rewrites(self) -> bool:
        """Whether applying it rewrites the shard's files (every row's key changes)."""
        return self.what in (WIDENED, DROPPED, RENAMED, REORDERED)


@dataclass(frozen=True)
class SchemaPlan:
    """The changes from the shard's columns to the sink file's (empty: the same schema)."""

    changes: tuple[Change, ...] = ()
    rows: int | None = None  # the shard's update rows, when known
    notes: tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return bool(self.changes)

    @property
    def supported(self) -> bool:
        return all(c.problem is None for c in self.changes)

    @property
    def added(self) -> list[Change]:
        return [c for c in self.changes if c.what == ADDED]

    @property
    def rewrites(self) -> bool:
        """Whether the run rewrites the shard's files into the new schema first (:mod:`reconcile.sink.evolve`)."""
        return any(c.rewrites for c in self.changes)

    def describe(self) -> str:
        return "; ".join(c.text() for c in self.changes)

    def cost(self) -> str:
        """What applying it costs: rows rewritten, and the correction it implies."""
        if not self.supported:
            return "nothing (refused)"
        if self.rewrites:
            rows = "every" if self.rows is None else f"{self.rows}"
            return (
                f"{rows} update rows rewritten (the shard's files, in the new schema with fresh row keys, committed "
                "with the batch's correction in its one Delta version; history kept)"
            )
        return (
            "0 rows rewritten (one metadata change in the next batch's commit; rows written before read "
            "the new column(s) as null; the batch retracts and re-adds every current row whose new "
            "column has a value)"
        )

    def refusal(self) -> str:
        return "; ".join(f"{c.text()}: {c.problem}" for c in self.changes if c.problem)


_DELTA_TYPES = {"tinyint": "byte", "smallint": "short", "int": "integer", "bigint": "long"}


def delta_type(spark_type: str) -> str:
    """A sink file's (Spark SQL) type as Delta's schema names it."""
    t = spark_type.lower().replace(" ", "")
    return _DELTA_TYPES.get(t, t)


def spark_type(delta: str) -> str:
    """A Delta schema's type as a sink file names it (:func:`delta_type` reversed)."""
    return {d: s for s, d in _DELTA_TYPES.items()}.get(delta, delta)


def _pairs(cfg: SinkConfig) -> list[tuple[str, str]]:
    return [(c.name.lower(), delta_type(c.type)) for c in cfg.columns]


def table_columns(schema_json: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(the sink's columns, the shard's own columns) of a Delta schema (its JSON), lowercased."""
    fields = json.loads(schema_json)["fields"]
    cols = [(f["name"].lower(), f["type"] if isinstance(f["type"], str) else json.dumps(f["type"])) for f in fields]
    own = [c for c in cols if c[0] in SHARD_COLUMNS]
    return [c for c in cols if c[0] not in SHARD_COLUMNS], own


def recorded_key(schema_json: str) -> tuple[str, ...] | None:
    """The upsert key a shard's Delta schema (its JSON) records (:data:`KEY_META` on its key
    columns' fields), lowercased, in table order; None when it records none (not an upsert shard,
    or one created before the key was recorded)."""
    fields = json.loads(schema_json)["fields"]
    found = tuple(f["name"].lower() for f in fields if (f.get("metadata") or {}).get(KEY_META))
    return found or None


def plan(
    cfg: SinkConfig, table_cols: list[tuple[str, str]], rows: int | None = None, key: tuple[str, ...] | None = None
) -> SchemaPlan:
    """The changes from ``table_cols`` (the shard's sink columns, ``(name, Delta type)`` in table
    order) to the sink file's columns; ``key``: the upsert key the shard records
    (:func:`recorded_key`), against the file's ``upsert.key``."""
    have = dict(table_cols)
    want = _pairs(cfg)
    declared = {c.name.lower(): (c.renamed_from or "").lower() or None for c in cfg.columns}
    nullable = {c.name.lower(): c.nullable for c in cfg.columns}
    keys = {k.lower() for k in getattr(cfg, "key_columns", ())}
    old_keys = set(key or ())
    wanted = {n for n, _ in want}
    changes: list[Change] = []
    notes: list[str] = []
    kept: list[str] = []  # the table's columns the file keeps (by their old name), in the file's order
    for name, typ in want:
        old_name = name if name in have else None
        src = declared[name]
        if old_name is None and src is not None:
            if src in have and src not in wanted:
                old_name = src
                changes.append(Change(RENAMED, name, old=src, key=name in keys or src in old_keys))
            else:
                notes.append(f"{name}.renamed_from: {src} is not a column of the shard (read as an added column)")
        if old_name is None:
            changes.append(Change(ADDED, name, new=typ, nullable=nullable[name], key=name in keys))
            continue
        kept.append(old_name)
        old_type = have[old_name]
        if old_type != typ:
            what = WIDENED if widens(old_type, typ) else RETYPED
            changes.append(Change(what, name, old=old_type, new=typ, key=name in keys))
    gone = [n for n, _ in table_cols if n not in kept]
    changes += [Change(DROPPED, n, key=n in old_keys) for n in gone]
    order = [n for n, _ in table_cols if n in kept]
    if order != kept:
        changes.append(Change(REORDERED, kept[0], new=", ".join(kept)))
    if key is not None and keys and old_keys != keys:  # the file's upsert.key is not the shard's
        new_key = ", ".join(k.lower() for k in getattr(cfg, "key_columns", ()))
        changes.append(Change(KEY, new_key, old=", ".join(key), new=new_key, key=True))
    return SchemaPlan(tuple(changes), rows, tuple(notes))


def sources(cfg: SinkConfig, schema_json: str) -> list[tuple[str, str | None]]:
    """Each of the sink file's columns with the column of a table (its Delta schema, JSON) it is
    read from, as the table names it: its own, or the one its ``renamed_from`` names (None: the
    table has none, an added column). How a table is read in the sink file's columns while the
    file's schema change waits for the run that applies it."""
    have = {f["name"].lower(): f["name"] for f in json.loads(schema_json)["fields"]}
    changes = plan(cfg, table_columns(schema_json)[0]).changes
    renamed = {c.column: c.old for c in changes if c.what == RENAMED}
    return [(c.name, have.get((renamed.get(c.name.lower()) or c.name).lower())) for c in cfg.columns]


def who_changed(table, current_schema: str) -> str:
    """``"sink"`` when the table's current schema was set by the sink's own commits (its creation,
    a batch, its maintenance), ``"foreign"`` when another writer's commit set it: the log read
    back from the latest version to the commit that introduced the schema it has now."""
    from reconcile.storage.commits import info_of, parse_actions, reconcile_meta

    want = table_columns(current_schema)
    versions = table.log_versions()
    setter: tuple[int, dict | None] | None = None
    for v in reversed(versions):
        text = table._commit_text(v)
        if text is None:  # removed by Delta's log cleanup: the rest is unknown, the sink's as far as seen
            break
        actions = parse_actions(text)
        meta = next((a["metaData"] for a in actions if "metaData" in a), None)
        if meta is None:
            continue
        if table_columns(meta["schemaString"]) != want:
            break
        setter = (v, reconcile_meta(info_of(actions)))
    if setter is None:
        return "sink"
    version, meta = setter
    return "sink" if version == 0 or meta is not None else "foreign"
