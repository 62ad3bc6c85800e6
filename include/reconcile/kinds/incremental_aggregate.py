"""A GROUP BY batch from its source's changes alone: each touched group's new row from its old row
(the shard's) and the changes' partial aggregates, without reading the source.

For ``SELECT k..., count(*), count(x), sum(x), min(x), max(x) FROM src [WHERE p] GROUP BY k...``
(aggregates of these kinds only, not DISTINCT, no FILTER clause, no HAVING; ``x`` and ``p``
deterministic expressions of the source's columns; ``sum`` of integers or decimals: exact
arithmetic), a change of the source's rows changes each group's aggregates by what the changed
rows themselves aggregate to, rows added counted +1 and rows removed -1 (:func:`partial`):

    count(*)  new = old + sum(sign)                     (the group's rows: 0 means it is gone)
    count(x)  new = old + sum(sign where x is not null)
    sum(x)    new = old + sum(sign * x)                  (null while no value of x is not null)
    max(x)    new = greatest(old, the largest value the changes add on net)

A value removed on net (its rows removed outnumber those added, per group and value: an update
that leaves ``x`` as it was adds and removes the same value, which cancel) that is not below the
old maximum (above the old minimum) may have been the only row holding it: such a group, a sum
whose values may all have become null, and a group whose rows may all be gone without a
``count(*)`` to say so, are recomputed from the source like any key-partitioned query
(:func:`reconcile.kinds.incremental.keyed_updates`); the others never read the source. The old
rows are the shard's, which the carried checksums say hold exactly the query's result as of the
previous batch (the condition of every batch from the changes).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from reconcile.differential import cached
from reconcile.kinds.catalyst import (
    ABOVE_NODES,
    Keyed,
    aliased,
    expr_id,
    expression_qualifier,
    node_kind,
    record_renames,
    seq_of,
)
from reconcile.sql_names import spark_name

# The aggregate functions maintained from partial aggregates, and the types a sum of which is exact.
FUNCTIONS = {"Count": "count", "Sum": "sum", "Min": "min", "Max": "max"}
EXACT_SUM = ("tinyint", "smallint", "int", "bigint", "decimal(")
SIDE = {"Filter", "SubqueryAlias", "View", "LogicalRelation", "Project"}


@dataclass(frozen=True)
class Output:
    """One output column of the query: a grouping key (``key``: its index) or an aggregate
    (``fn``: count, count_all, sum, min or max, over ``arg``: Spark SQL over the source's rows)."""

    name: str
    type: str
    key: int | None = None
    fn: str | None = None
    arg: str | None = None
    arg_nullable: bool = True


@dataclass(frozen=True)
class Aggregated:
    """A GROUP BY a batch maintains from partial aggregates: its source, the filters over the
    source's rows (Spark SQL), the key's parts (:class:`~reconcile.kinds.incremental.Keyed`'s)
    and its output columns in order."""

    source: str
    alias: str
    filters: list[str]
    keys: list[str]
    outputs: list[Output]

    def frame(self, df: DataFrame) -> DataFrame:
        return aliased(df, self.alias)


def aggregated(query: DataFrame, sources: dict[str, DataFrame], shape: Keyed) -> Aggregated | None:
    """The query as :class:`Aggregated`, or None (another shape: recomputed from the sources).
    ``shape``: :func:`reconcile.kinds.incremental.keyed`'s of the same query, a GROUP BY whose
    output carries the whole key."""
    if shape.what != "a GROUP BY" or shape.output is None or len(shape.keys) != 1:
        return None
    ((source, parts),) = shape.keys.items()
    if not parts:
        return None  # a global aggregate has a row even over no rows
    plan = query._jdf.queryExecution().analyzed()
    src = sources[source]
    origin = {expr_id(a): (source, str(a.name())) for a in seq_of(src._jdf.queryExecution().analyzed().output())}
    node, above = plan, dict[int, int]()
    while node.nodeName() in ABOVE_NODES:
        if node.nodeName() == "Filter":
            return None  # HAVING: the shard holds no row of the groups it drops
        record_renames(node, above)
        node = node.child()
    if node.nodeName() != "Aggregate":
        return None
    qualifiers = {shape.alias}  # the one alias the source's rows are read under, if any
    filters = _filters(node.child(), origin, src, qualifiers)
    if filters is None:
        return None
    groups = seq_of(node.groupingExpressions())
    produced: dict[int, Output] = {}
    for ne in seq_of(node.aggregateExpressions()):
        e = ne.child() if node_kind(ne) == "Alias" else ne
        name, type_ = str(ne.name()), str(ne.dataType().simpleString())
        at = next((i for i, g in enumerate(groups) if e.semanticEquals(g)), None)
        if at is not None:
            produced[expr_id(ne)] = Output(name, type_, key=at)
            continue
        out = _aggregate(e, name, type_, origin, src, qualifiers)
        if out is None:
            return None
        produced[expr_id(ne)] = out
    if len(qualifiers - {""}) > 1:
        return None
    outputs = []
    for a in seq_of(plan.output()):
        xid = expr_id(a)
        while xid not in produced and xid in above:
            xid = above[xid]
        if xid not in produced:
            return None  # an expression over the aggregates
        o = produced[xid]
        outputs.append(Output(str(a.name()), o.type, o.key, o.fn, o.arg, o.arg_nullable))
    return Aggregated(source, max(qualifiers), filters, parts, outputs)


def _readable(expr, origin, src: DataFrame, qualifiers: set[str]) -> bool:
    """Does ``expr``'s Spark SQL read back as itself over the source's rows (its qualifier added
    to ``qualifiers``)?"""
    alias = expression_qualifier(expr, origin, src)
    if alias is None:
        return False
    qualifiers.add(alias)
    return True


def _filters(side, origin, src: DataFrame, qualifiers: set[str]) -> list[str] | None:
    """The conditions of the filters between the aggregate and its source (Spark SQL over the
    source's rows), or None where a node there computes columns."""
    out = []
    n = side
    while True:
        name = n.nodeName()
        if name not in SIDE:
            return None
        if name == "Project" and any(node_kind(e) != "AttributeReference" for e in seq_of(n.projectList())):
            return None
        if name == "Filter":
            cond = n.condition()
            if not _readable(cond, origin, src, qualifiers):
                return None
            out.append(str(cond.sql()))
        children = seq_of(n.children())
        if name == "View" or not children:
            return out
        n = children[0]


def _aggregate(e, name: str, type_: str, origin, src: DataFrame, qualifiers: set[str]) -> Output | None:
    """An aggregate output the batch maintains (:data:`FUNCTIONS`), or None."""
    if node_kind(e) != "AggregateExpression" or e.isDistinct() or e.filter().isDefined():
        return None
    fn = e.aggregateFunction()
    kind = FUNCTIONS.get(node_kind(fn))
    args = seq_of(fn.children())
    if kind is None or len(args) != 1:
        return None
    arg = args[0]
    if kind == "count" and node_kind(arg) == "Literal" and arg.value() is not None:
        return Output(name, type_, fn="count_all")
    if kind == "sum" and not str(arg.dataType().simpleString()).startswith(EXACT_SUM):
        return None  # a floating sum is not exact: old + delta is not the sum recomputed
    if not _readable(arg, origin, src, qualifiers):
        return None
    return Output(name, type_, fn=kind, arg=str(arg.sql()), arg_nullable=bool(arg.nullable()))


# ---------------------------------------------------------------------------------------------


def _k(i: int) -> str:
    return f"_pa_k{i}"


def partial(
    agg: Aggregated, added: DataFrame, removed: DataFrame, old: DataFrame
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(new rows, old rows, keys to recompute) of the groups the changes touch: the new rows (the
    query's output columns) from ``old`` (the query's rows as of the previous batch, each once)
    and the changes' partial aggregates, for the groups that need no recomputation; their old
    rows; the key values (``_k0``...) of the rest."""
    keys = [F.expr(p).alias(_k(i)) for i, p in enumerate(agg.keys)]
    aggs = [o for o in agg.outputs if o.fn is not None]
    args = {o.arg for o in aggs if o.arg is not None}
    arg_col = {a: f"_pa_a{i}" for i, a in enumerate(sorted(args))}

    def side(df: DataFrame, sign: int) -> DataFrame:
        df = agg.frame(df)
        for cond in agg.filters:
            df = df.where(F.expr(cond))
        return df.select(*keys, *[F.expr(a).alias(c) for a, c in arg_col.items()], F.lit(sign).alias("_pa_s"))

    ch = side(added, 1).unionByName(side(removed, -1))
    kcols = [_k(i) for i in range(len(agg.keys))]
    s = F.col("_pa_s")
    sums: list[Column] = [F.sum(s).alias("_pa_rows")]
    for a, c in arg_col.items():
        sums.append(F.sum(F.when(F.col(c).isNotNull(), s).otherwise(0)).alias(f"{c}_nn"))
        if any(o.fn == "sum" and o.arg == a for o in aggs):
            typ = next(o.type for o in aggs if o.fn == "sum" and o.arg == a)
            sums.append(F.sum(F.col(c).cast(typ) * s).alias(f"{c}_sum"))
    delta = ch.groupBy(*kcols).agg(*sums)
    for a, c in arg_col.items():  # the values added and removed on net, per group and value
        if not any(o.fn in ("min", "max") and o.arg == a for o in aggs):
            continue
        net = ch.where(F.col(c).isNotNull()).groupBy(*kcols, c).agg(F.sum(s).alias("_pa_net"))
        up, down = F.col("_pa_net") > 0, F.col("_pa_net") < 0
        ends = net.groupBy(*[F.col(k).alias(f"_pa_e{i}") for i, k in enumerate(kcols)]).agg(
            F.max(F.when(up, F.col(c))).alias(f"{c}_add_max"),
            F.min(F.when(up, F.col(c))).alias(f"{c}_add_min"),
            F.max(F.when(down, F.col(c))).alias(f"{c}_del_max"),
            F.min(F.when(down, F.col(c))).alias(f"{c}_del_min"),
        )
        on = [F.col(k).eqNullSafe(F.col(f"_pa_e{i}")) for i, k in enumerate(kcols)]
        delta = delta.join(ends, on, "left").drop(*[f"_pa_e{i}" for i in range(len(kcols))])
    named = {o.key: o.name for o in agg.outputs if o.key is not None}
    before = old.select(
        *[F.col(spark_name(named[i])).alias(f"_pa_ok{i}") for i in range(len(kcols))],
        *[F.col(spark_name(o.name)).alias(f"_pa_o_{j}") for j, o in enumerate(agg.outputs)],
        F.lit(True).alias("_pa_was"),
    )
    on = [F.col(k).eqNullSafe(F.col(f"_pa_ok{i}")) for i, k in enumerate(kcols)]
    j = delta.join(before, on, "left")
    was = F.col("_pa_was").isNotNull()
    out_of = {o.name: F.col(f"_pa_o_{i}") for i, o in enumerate(agg.outputs)}
    rows = F.col("_pa_rows")
    count_all = next((o.name for o in agg.outputs if o.fn == "count_all"), None)
    if count_all is not None:
        exists = F.coalesce(out_of[count_all], F.lit(0)) + rows > 0
        again = F.lit(False)
    else:  # the group's rows are known gone only where it had none before
        exists = F.when(was, rows >= 0).otherwise(rows > 0)
        again = was & (rows < 0)
    values: dict[str, Column] = {}
    for o in agg.outputs:
        old_v = out_of[o.name]
        if o.key is not None:
            values[o.name] = F.col(kcols[o.key])
            continue
        c = arg_col.get(o.arg or "", "")
        if o.fn == "count_all":
            values[o.name] = F.coalesce(old_v, F.lit(0)) + rows
        elif o.fn == "count":
            values[o.name] = F.coalesce(old_v, F.lit(0)) + F.col(f"{c}_nn")
        elif o.fn == "sum":
            nn, dsum = F.col(f"{c}_nn"), F.coalesce(F.col(f"{c}_sum"), F.lit(0))
            known = _non_nulls(o, agg, out_of)  # the old count of values not null, where the outputs tell it
            if known is not None:
                after = known + nn
                values[o.name] = F.when(after > 0, F.coalesce(old_v, F.lit(0)) + dsum)
            else:  # not null before: still so while none is removed on net; null before: none was there
                again = again | (old_v.isNotNull() & (nn < 0))
                values[o.name] = F.when(old_v.isNotNull(), old_v + dsum).when(nn > 0, dsum)
        else:
            big = o.fn == "max"
            gone = F.col(f"{c}_del_max" if big else f"{c}_del_min")
            new = F.col(f"{c}_add_max" if big else f"{c}_add_min")
            again = again | (old_v.isNotNull() & gone.isNotNull() & ((gone >= old_v) if big else (gone <= old_v)))
            values[o.name] = (F.greatest if big else F.least)(old_v, new)
    # cached: the keys to recompute are collected first, then the write reads the same groups
    j = cached(j.withColumn("_pa_again", again).withColumn("_pa_exists", exists))
    settled = F.col("_pa_again") == F.lit(False)
    new_rows = j.where(settled & F.col("_pa_exists")).select(
        *[values[o.name].cast(o.type).alias(o.name) for o in agg.outputs]
    )
    old_rows = j.where(settled & was).select(*[out_of[o.name].alias(o.name) for o in agg.outputs])
    again_keys = j.where(F.col("_pa_again")).select(*[F.col(k).alias(f"_k{i}") for i, k in enumerate(kcols)])
    return new_rows, old_rows, again_keys


def _non_nulls(o: Output, agg: Aggregated, out_of: dict[str, Column]) -> Column | None:
    """The old count of ``o.arg``'s values that are not null, where an output says it: a
    ``count(arg)``, or ``count(*)`` when the argument cannot be null."""
    for other in agg.outputs:
        if other.fn == "count" and other.arg == o.arg:
            return F.coalesce(out_of[other.name], F.lit(0))
    if not o.arg_nullable:
        for other in agg.outputs:
            if other.fn == "count_all":
                return F.coalesce(out_of[other.name], F.lit(0))
    return None


__all__ = ["Aggregated", "aggregated", "partial"]
