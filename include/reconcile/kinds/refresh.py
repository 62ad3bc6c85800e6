"""Which way a query batch takes: from its Delta sources' changes, or the full comparison.

A query sink's ``query.refresh`` says which it may take: ``auto`` (the changes where they determine
the correction, :mod:`reconcile.kinds.incremental`, else in full), ``incremental`` (a batch that
cannot be fails, final, before anything is staged) or ``full`` (never the changes). Whatever the
policy, a first batch, a batch after the sink file's query, sources or columns changed, and a
batch that ``query.full_every`` makes due compare in full: ``full_every`` (at least every N
batches or every H hours of the shard's time, whichever comes first) is what repairs a change
nobody logged (a source rewritten behind its feed, a bug), since a batch from the changes never
reads the shard nor scans the sources.

Each batch records the way it took in its manifest (and its Delta commit) as
:class:`Refresh`: the way, why a full comparison, how many source versions an incremental batch
read, and the upper of the last full comparison with the batches since, which the next batch
reads to know whether a full comparison is due. Plain Python: no Spark.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from reconcile.errors import SinkError

if TYPE_CHECKING:
    from reconcile.config import QuerySink

INCREMENTAL, FULL = "incremental", "full"
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Refresh:
    """The way a batch took (``path``: incremental or full) and why (``why``: a full comparison's
    reason; ``versions``: the source versions an incremental batch read since the previous one);
    ``full_upper``: the upper of the last full comparison (this batch's, for a full one);
    ``since_full``: the batches since it, this one included (0 for a full one)."""

    path: str
    why: str | None = None
    versions: int | None = None
    full_upper: int | None = None
    since_full: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, raw: Any) -> Refresh | None:
        """The record a manifest holds (None: none, or not one)."""
        if not isinstance(raw, dict) or raw.get("path") not in (INCREMENTAL, FULL):
            return None
        ints = {k: raw.get(k) if isinstance(raw.get(k), int) else None for k in ("versions", "full_upper")}
        since = raw.get("since_full")
        why = raw.get("why")
        return cls(
            raw["path"],
            why if isinstance(why, str) else None,
            since_full=since if isinstance(since, int) else 0,
            **ints,
        )

    def text(self, rows_changed: int | None = None) -> str:
        """One short phrase: ``incremental (3 source versions, 12 rows changed)`` or ``full
        comparison: the query aggregates``."""
        if self.path == FULL:  # the reason without the error Spark gave, which the write's log has
            return f"full comparison: {self.why.split(': [', 1)[0]}" if self.why else "full comparison"
        n = self.versions or 0
        parts = [f"{n} source version{'' if n == 1 else 's'}"]
        if rows_changed is not None:
            parts.append(f"{rows_changed} row{'' if rows_changed == 1 else 's'} changed")
        return f"incremental ({', '.join(parts)})"


def full(upper: int, why: str) -> Refresh:
    """The record of a full comparison of the batch ending at ``upper``."""
    return Refresh(FULL, why, full_upper=upper, since_full=0)


def incremental(previous: Refresh | None, versions: int) -> Refresh:
    """The record of a batch from the changes, after ``previous`` (the previous batch's record)."""
    return Refresh(
        INCREMENTAL,
        versions=versions,
        full_upper=previous.full_upper if previous else None,
        since_full=(previous.since_full if previous else 0) + 1,
    )


def due(cfg: QuerySink, previous: Refresh | None, upper: int) -> str | None:
    """Why ``query.full_every`` makes the batch ending at ``upper`` a full comparison, or None.
    A previous batch that recorded no way (written before the record existed) makes it due."""
    every = cfg.query.full_every
    if previous is None or previous.full_upper is None:
        return "no full comparison recorded since the previous batches"
    if every.batches and previous.since_full + 1 >= every.batches:
        return f"the periodic one (full_every.batches: {every.batches})"
    if every.hours and upper - previous.full_upper >= every.hours * HOUR_MS:
        return f"the periodic one (full_every.hours: {every.hours})"
    return None


class IncrementalRefused(SinkError):
    """``refresh: incremental`` and the batch cannot be computed from the sources' changes: final
    (the same batch fails the same way), nothing staged."""

    remedy = (
        "set query.refresh: auto in the sink file (that batch then compares in full) or remove the cause, then "
        "rerun the write; nothing was staged."
    )


def refused(cfg: QuerySink, why: str) -> IncrementalRefused:
    """The one-line failure of a batch ``refresh: incremental`` cannot take from the changes."""
    return IncrementalRefused(
        f"refresh: incremental, and this batch cannot be computed from its sources' changes: {why}",
        sink=cfg.name,
        remedy=f"{hint(why)}set query.refresh: auto in {cfg.path or 'the sink file'} (that batch then compares in "
        "full), then rerun the write; nothing was staged.",
    )


def hint(why: str) -> str:
    """What removes a cause, where it is one a user removes (``""``: none)."""
    import re

    found = re.search(r"source (\w+) ", why)
    if found and ("change data feed" in why or "changed other than by appends" in why):
        return (
            f"enable the change data feed on source {found.group(1)} (ALTER TABLE ... SET TBLPROPERTIES "
            "(delta.enableChangeDataFeed = true)), whose next batch still compares in full, or "
        )
    return ""
