"""A query batch from its Delta sources' change feeds: the correction without the full comparison.

A query of projections, filters and ``UNION ALL`` over its sources is linear: ``Q(S + dS) = Q(S) +
Q(dS)`` for a multiset change ``dS``. When the shard holds exactly ``Q`` of the sources at the
versions the previous batch read (that batch committed, and nothing but the sink's own commits
touched the shard since: the condition under which its checksums are carried) and every source
is a Delta table whose change data feed covers the versions since, the correction is::

    consolidate( Q(inserts and update postimages since) * +1  +  Q(deletes and update preimages since) * -1 )

stamped at ``upper - 1``, computed from the changes alone: the sources are not scanned and the
shard is not read. A query partitioned by a key (one GROUP BY over one source, of its columns or
expressions of them; an inner or left join of two on equal columns: :func:`keyed`) is recomputed for the key values the changes touch
(:func:`keyed_updates`). Anything else (a window, a limit, a subquery, the clock or a random
number; a source that is not Delta, whose feed is off or does not reach back, or whose version
went back; the first batch; drift) takes the full comparison, with the reason on the batch's log.
A local source whose commits since only appended rows needs no feed: the files they added are
the change. The full comparison stays the proof: every batch of ``tests/test_incremental.py``
and ``tests/test_incremental_keyed.py`` equals the model computed from the sources in Python.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile.config import QuerySink
from reconcile.differential import as_of, cached, plan_nodes
from reconcile.errors import brief
from reconcile.kinds.catalyst import (
    ABOVE_NODES,
    Keyed,
    expr_id,
    expression_qualifier,
    node_kind,
    record_renames,
    resolve_alias,
    seq_of,
)
from reconcile.kinds.decode import delta_version
from reconcile.sql_names import spark_name

log = logging.getLogger(__name__)

# The analyzed plan's nodes a linear query may hold; and the functions that make a query's
# result change without its sources changing (Spark calls the clock's deterministic).
LINEAR_NODES = {"Project", "Filter", "Union", "SubqueryAlias", "View", "LogicalRelation", "LocalRelation"}
CLOCK = ("current_date", "current_timestamp", "current_time", "localtimestamp", "now(", "current_timezone")
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
ADDED = ("insert", "update_postimage")


class NotIncremental(Exception):
    """Why this batch takes the full comparison (said on the batch's log). ``shape``: the query
    is not linear for its nodes alone (it may be partitioned by a key: :func:`keyed`)."""

    def __init__(self, why: str, shape: bool = False) -> None:
        super().__init__(why)
        self.shape = shape


def require_linear(df: DataFrame, sources: set[str] | None = None) -> None:
    """Raise :class:`NotIncremental` unless the query is projections, filters and ``UNION ALL``
    of its ``sources`` (their views; and constants), deterministic, without the clock or a
    subquery."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        raise NotIncremental("over Spark Connect the query's plan is not inspected here")
    plan = jdf.queryExecution().analyzed()
    other = sorted(plan_nodes(plan) - LINEAR_NODES)
    if other:
        raise NotIncremental(f"the query is not only projections, filters and UNION ALL ({', '.join(other)})", True)
    text = plan.toString().lower()
    if not plan.deterministic() or any(c in text for c in CLOCK):
        raise NotIncremental("the query is not deterministic (a random number, the clock)")
    _no_subqueries(plan)
    if sources is not None:
        _reads_only(plan, {s.lower() for s in sources})


def _reads_only(plan, sources: set[str]) -> None:
    """Raise :class:`NotIncremental` where the query reads a table other than its sources' views
    (whose changes the batch does not see): a leaf that is not under one, and not a constant."""
    stack = [plan]
    while stack:
        n = stack.pop()
        if n.nodeName() == "View":
            try:
                name = str(n.desc().identifier().table()).lower()
            except Exception:  # noqa: BLE001 - a view not known: not a source
                name = ""
            if name not in sources:
                raise NotIncremental(f"the query reads a view that is not one of its sources ({name or '?'})")
            continue
        children = seq_of(n.children())
        if not children and n.nodeName() not in ("LocalRelation", "OneRowRelation"):
            raise NotIncremental("the query reads a table that is not one of its sources (its changes are not seen)")
        stack += children


def changes(
    spark: SparkSession,
    cfg: QuerySink,
    previous: dict[str, int],
    versions: dict[str, int],
    probes: list[tuple[str, DataFrame]] | None = None,
    sizes: dict[str, int] | None = None,
) -> tuple[dict[str, DataFrame], dict[str, DataFrame]]:
    """Per source, its rows added and removed since the version the previous batch read (the
    change data feed, versions ``previous + 1`` to the latest: ``versions``, read here into it when
    empty, :func:`latest_versions`). Each
    feed is read for one row here (:func:`probe`: one not recorded for some version fails before
    the write), or, given ``probes``, there to be probed by the caller (a keyed query reads the
    feeds whole before the write anyway). ``sizes``: the bytes of the files read per source, where
    known from its log."""
    import os

    sizes = {} if sizes is None else sizes
    added: dict[str, DataFrame] = {}
    removed: dict[str, DataFrame] = {}
    if not versions:
        versions.update(latest_versions(spark, cfg, previous))
    for src in cfg.sources:
        now, before = versions[src.name], previous[src.name]
        rows = spark.read.format("delta").options(**dict(src.options)).load(src.path).where(F.lit(False))
        if now == before:
            added[src.name] = removed[src.name] = rows
            sizes[src.name] = 0
            continue
        appended = appended_files(src.path, before, now)
        if appended is not None:  # only appends since: the added files are the change
            added[src.name] = spark.read.schema(rows.schema).parquet(*appended) if appended else rows
            removed[src.name] = rows
            sizes[src.name] = sum(os.path.getsize(f) for f in appended)
            continue
        files = feed_files(src.path, before, now)
        if files is not None and files.direct:  # the feed's files read as Parquet: no Delta planning
            added[src.name], removed[src.name] = _read_feed_files(spark, rows.schema, files)
            sizes[src.name] = sum(os.path.getsize(f) for f in (*files.cdc, *files.added, *files.removed))
            continue
        try:
            feed = (
                spark.read.format("delta")
                .options(**dict(src.options))
                .option("readChangeFeed", "true")
                .option("startingVersion", before + 1)
                .option("endingVersion", now)
                .load(src.path)
            )
        except Exception as exc:
            raise NotIncremental(unreadable(src.name, exc)) from None
        if files is None:  # not known from the log: Spark's read of a row says whether the feed reads
            if probes is None:
                probe([(src.name, feed)])
            else:
                probes.append((src.name, feed))
        kind = F.col("_change_type")
        keep = [c for c in feed.columns if c not in CDF_COLUMNS]
        added[src.name] = feed.where(kind.isin(*ADDED)).select(*keep)
        removed[src.name] = feed.where(~kind.isin(*ADDED)).select(*keep)
    return added, removed


def _read_feed_files(spark: SparkSession, schema, files: FeedFiles) -> tuple[DataFrame, DataFrame]:
    """(rows added, rows removed) of the change data feed's ``files``, read as Parquet."""
    from pyspark.sql.types import StringType, StructField, StructType

    added: list[DataFrame] = []
    removed: list[DataFrame] = []
    if files.cdc:
        with_kind = StructType([*schema.fields, StructField("_change_type", StringType())])
        cdc = spark.read.schema(with_kind).parquet(*files.cdc)
        kind = F.col("_change_type")
        added.append(cdc.where(kind.isin(*ADDED)).drop("_change_type"))
        removed.append(cdc.where(~kind.isin(*ADDED)).drop("_change_type"))
    if files.added:
        added.append(spark.read.schema(schema).parquet(*files.added))
    if files.removed:
        removed.append(spark.read.schema(schema).parquet(*files.removed))

    def union(frames: list[DataFrame]) -> DataFrame:
        if not frames:
            return spark.createDataFrame([], schema)
        out = frames[0]
        for df in frames[1:]:
            out = out.unionByName(df)
        return out

    return union(added), union(removed)


def latest_versions(spark: SparkSession, cfg: QuerySink, previous: dict[str, int]) -> dict[str, int]:
    """Each source's latest Delta version (its log read in this process where delta-rs reads it:
    no Spark job), checked to follow the version the previous batch read (``previous``)."""
    out: dict[str, int] = {}
    for src in cfg.sources:
        if src.format != "delta" or src.name not in previous:
            raise NotIncremental(f"source {src.name} is not a Delta table read by the previous batch")
        if {"versionAsOf", "timestampAsOf"} & set(dict(src.options)):
            raise NotIncremental(f"source {src.name} is read at a fixed version")
        now, before = delta_version(spark, cfg, src, f"query.sources.{src.name}"), previous[src.name]
        if now < before:
            raise NotIncremental(f"source {src.name} went back from version {before} to {now} (a restore)")
        out[src.name] = now
    return out


def unreadable(name: str, exc: BaseException) -> str:
    return f"source {name} changed other than by appends and its change data feed is not readable: {brief(exc, 200)}"


def probe(feeds: list[tuple[str, DataFrame]]) -> None:
    """Read one row of each source's change feed: one not recorded for some version fails here,
    before the write, not mid-write."""
    for name, feed in feeds:
        try:
            feed.limit(1).collect()
        except Exception as exc:
            raise NotIncremental(unreadable(name, exc)) from None


# The actions of a commit that only appends rows (``add`` with dataChange); any other action that
# changes data or the table's shape (``remove``, ``metaData``, ``protocol``, ``cdc``, a deletion
# vector) makes the commit not an append.
APPEND_ONLY_ACTIONS = {"add", "commitInfo", "txn", "domainMetadata"}


def _log_actions(root: str, version: int) -> list[dict] | None:
    """The actions of commit ``version`` of the local Delta table at ``root`` (None: not readable)."""
    import json
    import os

    try:
        with open(os.path.join(root, "_delta_log", f"{version:020d}.json"), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except (OSError, ValueError):
        return None


# The actions a commit whose change data Delta's feed reads may hold (no metaData or protocol: a
# change of the table's shape or its properties is left to Delta's reader to judge).
FEED_ACTIONS = {"add", "remove", "cdc", "commitInfo", "txn", "domainMetadata"}


@dataclass(frozen=True)
class FeedFiles:
    """The files the change data feed of some versions reads (absolute paths): the ``cdc`` files of
    the commits that wrote some (rows with ``_change_type``), the files the others added (inserts)
    and removed (deletes); ``direct``: readable as Parquet as they are (the table unpartitioned,
    without column mapping), else through Delta's reader."""

    cdc: list[str]
    added: list[str]
    removed: list[str]
    direct: bool


def feed_files(path: str, before: int, now: int) -> FeedFiles | None:
    """The files the change data feed of versions ``before + 1`` to ``now`` of the local Delta table
    at ``path`` reads, by its log alone (no Spark job), when the feed reads: it is on
    (``delta.enableChangeDataFeed``) and no commit since changed the table's metadata or protocol;
    each commit's log is there, and every file its feed reads (its ``cdc`` files, else the files it
    added and removed with a data change) is there, none with a deletion vector. None: not known
    here (a remote store; anything else), so Spark's reader is asked (:func:`probe`)."""
    import os
    from urllib.parse import unquote

    root = path.removeprefix("file:")
    if "://" in root:
        return None
    try:
        from deltalake import DeltaTable

        meta = DeltaTable(root, version=now).metadata()
    except Exception:  # noqa: BLE001 - Spark's reader says what is wrong
        return None
    config = meta.configuration
    if str(config.get("delta.enableChangeDataFeed", "")).lower() != "true":
        return None
    direct = not meta.partition_columns and config.get("delta.columnMapping.mode", "none") == "none"
    out = FeedFiles([], [], [], direct)
    for v in range(before + 1, now + 1):
        actions = _log_actions(root, v)
        if actions is None or any(len(a) != 1 or next(iter(a)) not in FEED_ACTIONS for a in actions):
            return None
        cdc = [a["cdc"] for a in actions if "cdc" in a]
        changed = [(k, a[k]) for a in actions for k in ("add", "remove") if k in a and a[k].get("dataChange", True)]
        for kind, f in [("cdc", f) for f in cdc] if cdc else changed:
            full = os.path.join(root, unquote(f["path"]))
            if f.get("deletionVector") or "://" in f["path"] or not os.path.exists(full):
                return None
            {"cdc": out.cdc, "add": out.added, "remove": out.removed}[kind].append(full)
    return out


def appended_files(path: str, before: int, now: int) -> list[str] | None:
    """The data files commits ``before + 1`` to ``now`` of the local Delta table at ``path`` added,
    when those commits only appended rows to an unpartitioned table (their JSON files read here:
    no Spark job); else None (a remote store, a partitioned table, a commit that removed, rewrote
    or restructured anything, a log already cleaned up)."""
    import os
    from urllib.parse import unquote

    root = path.removeprefix("file:")
    if "://" in root:
        return None
    files: list[str] = []
    for v in range(before + 1, now + 1):
        actions = _log_actions(root, v)
        if actions is None:
            return None
        for action in actions:
            (kind,) = action.keys() if len(action) == 1 else (None,)
            if kind not in APPEND_ONLY_ACTIONS:
                return None
            if kind == "add":
                add = action["add"]
                if not add.get("dataChange", True) or add.get("deletionVector") or add.get("partitionValues"):
                    return None
                rel = unquote(add["path"])
                if "://" in rel:
                    return None
                files.append(os.path.join(root, rel))
    return files


def run_on(spark: SparkSession, cfg: QuerySink, views: dict[str, DataFrame]) -> DataFrame:
    """The query run with each source's name bound to ``views``."""
    for name, df in views.items():
        df.createOrReplaceTempView(name)
    try:
        df = spark.sql(cfg.sql)
        df.schema  # noqa: B018
    except Exception as exc:  # the full comparison says what is wrong in its own words
        raise NotIncremental(f"query.sql does not run over the changes: {brief(exc, 200)}") from None
    return df


# ---------------------------------------------------------------------------------------------
# Queries partitioned by a key: GROUP BY, and equi-joins. Their result, restricted to the rows of
# some key values, is the query over the sources restricted to those key values; a change
# reaches only the rows of its own key values. So the correction is the query over the sources
# filtered to the touched key values, as of now, minus the same as of the previous batch (the
# shard's rows of those groups, or the query over the sources at the versions it read).

# The analyzed plan's nodes a key-partitioned query may hold on each source's side below its GROUP
# BY or join (one source, its columns traced through these by their expression ids; above it:
# catalyst.ABOVE_NODES).
SIDE_NODES = {"Project", "Filter", "SubqueryAlias", "View", "LogicalRelation"}
JOINS = {"Inner": "an inner", "LeftOuter": "a left outer"}
# Touched key values up to this many are filtered by literal values (IN lists: the sources' data
# skipping prunes files); more, by a broadcast semi-join. Literal values only of these types.
FEW_KEYS = 1000
LITERAL_TYPES = {"tinyint", "smallint", "int", "bigint", "string", "date", "boolean"}


def literal(type_name: str) -> bool:
    """Are values of this Spark type compared as Python literals exactly (in an IN list)?"""
    return type_name in LITERAL_TYPES or type_name.startswith("decimal(")


def _side(node, origin: dict[int, tuple[str, str]], aliases: dict[int, int]) -> str:
    """The one source below ``node``, a chain of projections and filters over its read."""
    names = set()
    n = node
    while True:
        names.add(n.nodeName())
        record_renames(n, aliases)
        children = seq_of(n.children())
        if n.nodeName() == "View" or not children:
            break
        if len(children) != 1:
            raise NotIncremental(
                f"a side of the query is not one source under projections and filters ({n.nodeName()})"
            )
        n = children[0]
    other = sorted(names - SIDE_NODES)
    if other:
        raise NotIncremental(
            f"a side of the query is not one source under projections and filters ({', '.join(other)})"
        )
    found = {origin.get(expr_id(a), ("", ""))[0] for a in seq_of(n.output())}
    if len(found) != 1 or "" in found:
        raise NotIncremental("a side of the query does not read one source once (a source read twice, a constant)")
    return found.pop()


def _no_subqueries(plan) -> None:
    stack = [plan]
    while stack:
        n = stack.pop()
        if n.subqueries().size():
            raise NotIncremental("the query holds a subquery (IN, EXISTS or a scalar subquery)")
        stack += seq_of(n.children())


def keyed(df: DataFrame, sources: dict[str, DataFrame]) -> Keyed:
    """The key a query's result is partitioned by: a GROUP BY (or DISTINCT) over one source whose
    grouping keys are its columns or deterministic expressions of them (whose SQL reads back as
    themselves), or an inner or left join of two sources on equalities of their plain columns, under projections, filters and HAVING; deterministic, without the clock,
    without a subquery. ``df``: the query analysed over ``sources`` (each source's rows as read).
    Raises :class:`NotIncremental` saying what does not fit."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        raise NotIncremental("over Spark Connect the query's plan is not inspected here")
    plan = jdf.queryExecution().analyzed()
    text = plan.toString().lower()
    if not plan.deterministic() or any(c in text for c in CLOCK):
        raise NotIncremental("the query is not deterministic (a random number, the clock)")
    _no_subqueries(plan)
    origin = {
        expr_id(a): (name, str(a.name()))
        for name, src in sources.items()
        for a in seq_of(src._jdf.queryExecution().analyzed().output())
    }
    node, above = plan, dict[int, int]()  # the nodes above the GROUP BY or join, and their renames
    while node.nodeName() in ABOVE_NODES:
        record_renames(node, above)
        node = node.child()
    if node.nodeName() in ("Aggregate", "Distinct"):
        return _grouped(plan, node, origin, above, sources)
    if node.nodeName() == "Join":
        return _joined(node, origin)
    raise NotIncremental(
        "the query is not projections, filters and UNION ALL, nor one GROUP BY or join under projections and "
        f"filters ({', '.join(sorted(plan_nodes(plan) - LINEAR_NODES - ABOVE_NODES)) or node.nodeName()})"
    )


def _grouped(
    top, agg, origin: dict[int, tuple[str, str]], above: dict[int, int], sources: dict[str, DataFrame]
) -> Keyed:
    child, aliases = agg.child(), dict[int, int]()
    source = _side(child, origin, aliases)
    if agg.nodeName() == "Distinct":
        groups, outputs = seq_of(child.output()), seq_of(child.output())
    else:
        groups, outputs = seq_of(agg.groupingExpressions()), seq_of(agg.aggregateExpressions())
    parts, qualifiers = [], set()
    for g in groups:
        got = origin.get(resolve_alias(expr_id(g), aliases)) if node_kind(g) == "AttributeReference" else None
        if got is not None:
            parts.append(spark_name(got[1]))
            continue
        qualifier = expression_qualifier(g, origin, sources[source])
        if qualifier is None:
            raise NotIncremental(f"the GROUP BY key {g.sql()} is not a column or an expression of a source's columns")
        qualifiers.add(qualifier)
        parts.append(str(g.sql()))
    if len(qualifiers - {""}) > 1:
        raise NotIncremental("the GROUP BY keys name their source's columns under more than one alias")
    # the aggregate's outputs that are a grouping key as it is, then the query's that are those
    carried: dict[int, int] = {}
    for ne in outputs:
        e = ne.child() if node_kind(ne) == "Alias" else ne
        for i, g in enumerate(groups):
            if e.semanticEquals(g):
                carried[expr_id(ne)] = i
                break
    output: list[str | None] = [None] * len(groups)
    for a in seq_of(top.output()):
        xid = expr_id(a)
        while xid not in carried and xid in above:
            xid = above[xid]
        at = carried.get(xid)
        if at is not None and output[at] is None:
            output[at] = str(a.name())
    whole = None if any(o is None for o in output) else [o for o in output if o is not None]
    return Keyed("a GROUP BY", {source: parts}, whole, max(qualifiers, default=""))


def _conjuncts(expr) -> list:
    if expr.nodeName() == "And":
        return _conjuncts(expr.left()) + _conjuncts(expr.right())
    return [expr]


def _joined(join, origin: dict[int, tuple[str, str]]) -> Keyed:
    aliases: dict[int, int] = {}
    how = str(join.joinType().toString())
    if how not in JOINS:
        raise NotIncremental(f"the query's join is {how}, not an inner or left outer join")
    left, right = (_side(join.left(), origin, aliases), _side(join.right(), origin, aliases))
    if left == right:
        raise NotIncremental(f"the query joins source {left} with itself")
    sides = {
        id_: name
        for name, side in ((left, join.left()), (right, join.right()))
        for id_ in map(expr_id, seq_of(side.output()))
    }
    keys: dict[str, list[str]] = {left: [], right: []}
    condition = join.condition()
    for c in _conjuncts(condition.get()) if condition.isDefined() else []:
        if c.nodeName() not in ("EqualTo", "EqualNullSafe"):
            continue
        a, b = c.left(), c.right()
        if node_kind(a) != "AttributeReference" or node_kind(b) != "AttributeReference":
            continue
        ends = {sides.get(expr_id(a), ""): a, sides.get(expr_id(b), ""): b}
        if set(ends) != {left, right}:
            continue
        found = {n: origin.get(resolve_alias(expr_id(e), aliases)) for n, e in ends.items()}
        if any(f is None or f[0] != n for n, f in found.items()):
            continue
        for n, f in found.items():
            assert f is not None
            keys[n].append(spark_name(f[1]))
    if not keys[left]:
        raise NotIncremental("the query's join has no equality of a column of each source")
    return Keyed(f"{JOINS[how]} join", keys, None)


def read_at(spark: SparkSession, cfg: QuerySink, name: str, version: int) -> DataFrame:
    """Source ``name`` as of its Delta ``version``."""
    (src,) = [s for s in cfg.sources if s.name == name]
    return spark.read.format("delta").options(**dict(src.options)).option("versionAsOf", version).load(src.path)


def touched(keyed_: Keyed, added: dict[str, DataFrame], removed: dict[str, DataFrame]) -> DataFrame:
    """The key values (``_k0``, ``_k1``, ...) of the rows added to or removed from the sources."""
    sides = [
        keyed_.frame(df).select(*[F.expr(e).alias(f"_k{i}") for i, e in enumerate(parts)])
        for name, parts in keyed_.keys.items()
        for df in (added[name], removed[name])
    ]
    out = sides[0]
    for more in sides[1:]:
        out = out.unionByName(more)
    return out.distinct()


class KeyFilter:
    """Rows whose key is among the touched values: for a few, an IN list of each key column's
    values (a superset of the touched tuples that selects whole keys alike on every side, and that
    the sources' data skipping prunes by), else a broadcast null-safe semi-join."""

    def __init__(self, keys: DataFrame) -> None:
        self.keys = keys
        simple = all(literal(f.dataType.simpleString()) for f in keys.schema.fields)
        self.values: list[list] | None = None
        self.count: int | None = None
        try:  # the changes are read here, before the write: a feed not readable is said, not failed
            rows = keys.limit(FEW_KEYS + 1).collect() if simple else None
            if rows is not None and len(rows) <= FEW_KEYS:
                self.count = len(rows)
                self.values = [
                    sorted({r[i] for r in rows}, key=lambda v: (v is None, v)) for i in range(len(keys.columns))
                ]
            else:
                self.keys = cached(keys)
                self.none = not self.keys.limit(1).collect()
        except Exception as exc:
            raise NotIncremental(f"the sources' changes are not readable: {brief(exc, 200)}") from None

    def empty(self) -> bool:
        return self.count == 0 if self.count is not None else self.none

    def apply(self, df: DataFrame, parts: list[str]) -> DataFrame:
        """``df``'s rows whose key (``parts``: Spark SQL over ``df``) is among the touched."""
        if self.values is not None:
            for part, values in zip(parts, self.values, strict=True):
                col, present = F.expr(part), [v for v in values if v is not None]
                cond = col.isin(*present) if present else F.lit(False)
                df = df.where(cond | col.isNull() if None in values else cond)
            return df
        keys = self.keys.select(*[F.col(f"_k{i}").alias(f"_reconcile_k{i}") for i in range(len(parts))])
        on = [F.expr(part).eqNullSafe(F.col(f"_reconcile_k{i}")) for i, part in enumerate(parts)]
        return df.join(F.broadcast(keys), on, "left_semi")


def read_before(spark: SparkSession, cfg: QuerySink, name: str, version: int, now: int) -> DataFrame:
    """Source ``name`` as of ``version`` (an earlier one than ``now``, read as of now), checked
    readable before the write (its files not vacuumed; else :class:`NotIncremental`). A local
    table that has no partitions, column mapping or deletion vectors and the same schema at both
    versions is read as the Parquet files its log names at ``version`` (the log replayed in this
    process: no snapshot of Delta's built for the old version); any other through Delta's reader."""
    import os

    (src,) = [s for s in cfg.sources if s.name == name]
    root = src.path.removeprefix("file:")
    gone = f"source {name}'s files as of version {version} are gone (vacuumed)"
    try:
        if "://" in root:
            files = read_at(spark, cfg, name, version).inputFiles()
            jvm = spark._jvm
            assert jvm is not None
            conf = spark._jsc.hadoopConfiguration()
            for f in files:
                p = jvm.org.apache.hadoop.fs.Path(f)
                if not p.getFileSystem(conf).exists(p):
                    raise NotIncremental(gone)
            return read_at(spark, cfg, name, version)
        from deltalake import DeltaTable

        then = DeltaTable(root, version=version)
        files = then.file_uris()
        if not all(os.path.exists(f.removeprefix("file://")) for f in files):
            raise NotIncremental(gone)
        meta = then.metadata()
        plain = (
            not meta.partition_columns
            and meta.configuration.get("delta.columnMapping.mode", "none") == "none"
            and "deletionVectors" not in (then.protocol().reader_features or [])
            and then.schema().to_json() == DeltaTable(root, version=now).schema().to_json()
        )
    except NotIncremental:
        raise
    except Exception as exc:
        raise NotIncremental(f"source {name} is not readable as of version {version}: {brief(exc, 200)}") from None
    if not plain:
        return read_at(spark, cfg, name, version)
    schema = read_at(spark, cfg, name, now).schema
    if not files:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(*files)


def may_err(cfg: QuerySink, df: DataFrame) -> bool:
    """Can :func:`~reconcile.kinds.decode.validate` turn a row of ``df`` into an error row (a
    column not of the sink's type, or one that must not be null)?"""
    have = {f.name.lower(): f.dataType.simpleString() for f in df.schema.fields}
    return any(have.get(c.name.lower()) != c.type or not c.nullable for c in cfg.columns)


def keyed_updates(
    spark: SparkSession,
    cfg: QuerySink,
    previous: dict[str, int],
    versions: dict[str, int],
    changed: tuple[dict[str, DataFrame], dict[str, DataFrame]],
    persist: DataFrame | None,
    upper: int,
) -> tuple[DataFrame, DataFrame]:
    """(new, old) update frames of a key-partitioned query (:func:`keyed`), each +1: the query over
    the sources as of ``versions`` filtered to the key values the changes touch, and the rows those
    keys had: the shard's (``persist`` below ``upper``) where the query's output carries the whole
    key and no row can be an error row (whose columns are null), else the query over the sources
    as of ``previous`` filtered alike. Their difference is the correction."""
    from reconcile.kinds.decode import require_columns, validate
    from reconcile.kinds.protocol import QUERY_SOURCE

    # the query's shape from the sources as they are (their latest snapshots, which Delta keeps:
    # no log replayed for an older version); their rows read at ``versions`` only where recomputed
    latest = {s.name: spark.read.format("delta").options(**dict(s.options)).load(s.path) for s in cfg.sources}
    query = run_on(spark, cfg, latest)
    shape = keyed(query, latest)
    named = {c.name.lower(): c.name for c in cfg.columns}
    columns = [named.get(o.lower()) for o in shape.output or []]
    from_shard = persist is not None and shape.output is not None and None not in columns and not may_err(cfg, query)
    partial = None
    if from_shard:
        from reconcile.kinds import incremental_aggregate

        partial = incremental_aggregate.aggregated(query, latest, shape)
    if partial is not None:  # each group's new row from its old one and the changes' partial aggregates
        assert persist is not None
        old_rows = as_of(cfg, persist.where(F.col("_time") < upper), upper - 1).select(
            *[F.col(spark_name(named[o.name.lower()])).alias(o.name) for o in partial.outputs]
        )
        add, rem = changed[0][partial.source], changed[1][partial.source]
        try:  # the changes are read here, before the write: a feed not readable is said, not failed
            settled_new, settled_old, again = incremental_aggregate.partial(partial, add, rem, old_rows)
        except Exception as exc:
            raise NotIncremental(f"the sources' changes are not readable: {brief(exc, 200)}") from None
        keys = KeyFilter(again)
        new = validate(cfg, settled_new, QUERY_SOURCE, F.lit(1), None)
        old = validate(cfg, settled_old, QUERY_SOURCE, F.lit(1), None)
        if keys.empty():
            log.info(
                "incremental: %s: each touched group's row from its old one and the changes' aggregates", shape.what
            )
            return new, old
    else:
        keys = KeyFilter(touched(shape, *changed))
        if keys.empty():
            nothing = spark.createDataFrame([], validate(cfg, query, QUERY_SOURCE, F.lit(1), None).schema)
            return nothing, nothing

    current = {s.name: read_at(spark, cfg, s.name, versions[s.name]) for s in cfg.sources}

    def run(sources: dict[str, DataFrame]) -> DataFrame:
        views = {n: keys.apply(shape.frame(df), shape.keys[n]) if n in shape.keys else df for n, df in sources.items()}
        df = run_on(spark, cfg, views)
        require_columns(cfg, df, cfg.column_names, QUERY_SOURCE)
        return validate(cfg, df, QUERY_SOURCE, F.lit(1), None)

    recomputed = run(current)
    if from_shard:
        assert persist is not None
        old_r = keys.apply(persist.where(F.col("_time") < upper), [spark_name(c) for c in columns if c is not None])
        whence = "the shard"
    else:
        before = {n: read_before(spark, cfg, n, previous[n], versions[n]) for n in shape.keys}
        old_r = run({n: before.get(n, df) for n, df in current.items()})
        whence = "the sources as of the previous batch's versions"
    touched_ = "touched key values" if keys.count is None else f"{keys.count} touched key value(s)"
    if partial is not None:
        log.info(
            "incremental: %s: each touched group's row from its old one and the changes' aggregates, but "
            "the %s whose extremes or counts the changes leave unknown, recomputed",
            shape.what,
            touched_,
        )
        return new.unionByName(recomputed), old.unionByName(old_r.select(*[spark_name(c) for c in old.columns]))
    log.info("incremental: %s: the %s recomputed, their old rows from %s", shape.what, touched_, whence)
    return recomputed, old_r
