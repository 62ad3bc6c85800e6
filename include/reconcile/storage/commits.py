"""What the sink makes of one Delta version, from its commit file's actions alone (no table, no
I/O): the sink's own commit metadata, maintenance that changes no data, or a foreign data change.

Every Delta commit the sink makes carries ``userMetadata = {"reconcile": {...}}`` naming the
operation and, for a batch, its ``batch_id``, ``lower`` and ``upper``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import unquote

from reconcile.model import CommitRecord, FeedProgress

META_KEY = "reconcile"
MAINTENANCE = "maintenance"


def info_of(actions: list[dict]) -> dict:
    """The ``commitInfo`` action of a version's actions (empty if none)."""
    return next((a["commitInfo"] for a in actions if "commitInfo" in a), {})


def reconcile_meta(info: dict) -> dict | None:
    """The sink's own commit metadata (``userMetadata["reconcile"]``), None for foreign commits."""
    try:
        meta = json.loads(info.get("userMetadata") or "").get(META_KEY)
    except (ValueError, AttributeError):
        return None
    return meta if isinstance(meta, dict) else None


def describe_commit(actions: list[dict]) -> dict | None:
    """The sink's own commit metadata; for a foreign commit that changes no data (``VACUUM
    START``/``END``, ``OPTIMIZE``, table properties: no ``add``/``remove`` with ``dataChange``)
    ``{"op": "maintenance", ...}``; None for a foreign commit that changes data (drift the next
    batch repairs and measures)."""
    info = info_of(actions)
    meta = reconcile_meta(info)
    if meta is not None:
        return meta
    changes = [a.get("add") or a.get("remove") or {} for a in actions if "add" in a or "remove" in a]
    if any(c.get("dataChange", True) for c in changes):
        return None
    return {"op": MAINTENANCE, "operation": info.get("operation")}


def parse_actions(text: str) -> list[dict]:
    """A commit file's actions (one JSON object per line)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def batch_commits(entries: list[tuple[int, dict | None]]) -> list[CommitRecord]:
    """The sink's batch commits among ``(version, describe_commit)`` entries."""
    return [
        CommitRecord(
            version=v,
            batch_id=m["batch_id"],
            lower=int(m["lower"]),
            upper=int(m["upper"]),
            run_id=m.get("run_id"),
            rows_ok=m.get("rows_ok"),
            rows_err=m.get("rows_err"),
            feed=FeedProgress.recorded(m.get("late_commands"), m.get("source_offset")),
            stage_id=m.get("stage_id"),
        )
        for v, m in entries
        if m and m.get("op") == "batch"
    ]


def added_files(actions: list[dict]) -> list[dict]:
    """The ``add`` actions of a Delta version, paths relative to the table and decoded."""
    return [{**a["add"], "path": unquote(a["add"]["path"])} for a in actions if "add" in a]


@dataclass(frozen=True)
class ForeignCommit:
    """A Delta version that another writer made and that changed data: who made it, and the
    rows of the files it added and removed (their ``numRecords`` statistics; None where a file
    has none: delta-rs writes ``remove`` actions without statistics, ``removed_paths`` names
    those files so a reader can look their rows up in the version before)."""

    version: int
    operation: str
    engine: str
    user: str | None
    timestamp: int | None
    rows_added: int | None = None
    rows_removed: int | None = None
    removed_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, version: int, actions: list[dict]) -> ForeignCommit:
        info = info_of(actions)
        ts = info.get("timestamp")
        adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        removes = [a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)]
        return cls(
            version=version,
            operation=str(info.get("operation") or "?"),
            engine=str(info.get("engineInfo") or info.get("clientVersion") or "?"),
            user=info.get("userName") or info.get("userId"),
            timestamp=ts if isinstance(ts, int) else None,
            rows_added=_records(adds),
            rows_removed=_records(removes),
            removed_paths=tuple(unquote(r["path"]) for r in removes),
        )


def _records(files: list[dict]) -> int | None:
    """The rows of ``add``/``remove`` actions from their statistics (None if one has none)."""
    total = 0
    for f in files:
        try:
            total += int(json.loads(f.get("stats") or "")["numRecords"])
        except (ValueError, KeyError, TypeError):
            return None
    return total


def runs_of(versions: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs ``(first, last)`` of ascending ``versions``."""
    runs: list[tuple[int, int]] = []
    for v in versions:
        if runs and runs[-1][1] == v - 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs
