"""Reading Spark's analysed query plans (Catalyst's nodes, through py4j) for the incremental
corrections: which source a column comes from, the renames a projection makes, whether an
expression's SQL reads back as itself over a source's rows; and :class:`Keyed`, a query whose result
is partitioned by a key (:func:`reconcile.kinds.incremental.keyed` finds it)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# The analyzed plan's nodes a key-partitioned query may hold above its GROUP BY or join.
ABOVE_NODES = {"Project", "Filter", "SubqueryAlias", "Sort"}


@dataclass(frozen=True)
class Keyed:
    """A query whose result is partitioned by a key: ``keys`` gives, per source, the key's parts
    (in order) as Spark SQL over the source's rows (a quoted column, or a deterministic expression
    of its columns qualified by ``alias``: the source's frame is aliased so); ``output``, the query's
    output columns that carry them (None when one is not in the output); ``what``, for the log."""

    what: str
    keys: dict[str, list[str]]
    output: list[str] | None
    alias: str = ""

    def frame(self, df: DataFrame) -> DataFrame:
        """``df`` (a source's rows) as the key's expressions read it."""
        return aliased(df, self.alias)


def aliased(df: DataFrame, alias: str) -> DataFrame:
    """``df`` under ``alias`` (an expression qualified by it then reads its columns), or as it is."""
    return df.alias(alias) if alias else df


def seq_of(seq) -> list:
    return [seq.apply(i) for i in range(seq.size())]


def node_kind(expr) -> str:
    return expr.getClass().getSimpleName()


def expr_id(expr) -> int:
    return int(expr.exprId().id())


def record_renames(node, into: dict[int, int]) -> None:
    """Record the plain renames (``col AS name``) of a Project ``node``."""
    if node.nodeName() == "Project":
        for ne in seq_of(node.projectList()):
            if node_kind(ne) == "Alias" and node_kind(ne.child()) == "AttributeReference":
                into[expr_id(ne)] = expr_id(ne.child())


def resolve_alias(xid: int, aliases: dict[int, int]) -> int:
    while xid in aliases:
        xid = aliases[xid]
    return xid


def expression_qualifier(expr, origin: dict[int, tuple[str, str]], source: DataFrame) -> str | None:
    """The one-part qualifier under which ``expr``'s Spark SQL (``expr.sql()``) reads the same
    deterministic expression of the source's columns over its rows ("" for a constant), or None
    (a column of a projection below, an expression whose SQL does not read back as itself)."""
    if not expr.deterministic():
        return None
    refs = seq_of(expr.references().toSeq())
    if any(expr_id(r) not in origin for r in refs):
        return None
    qualifiers = {tuple(str(q) for q in seq_of(r.qualifier())) for r in refs}
    if len(qualifiers) > 1 or any(len(q) != 1 for q in qualifiers):
        return None
    alias = qualifiers.pop()[0] if qualifiers else ""
    try:
        frame = source.alias(alias) if alias else source
        back = frame.select(F.expr(str(expr.sql())))._jdf.queryExecution().analyzed().projectList().apply(0)
        back = back.child() if node_kind(back) == "Alias" else back
        if back.semanticEquals(expr):
            return alias
    except Exception:  # noqa: BLE001 - its SQL does not read back
        pass
    return None
