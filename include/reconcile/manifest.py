"""A batch's manifest: what one write attempt staged, per hash partition (its files with sizes
and content digests, rows, error rows, weight, net change and checksums), and the batch it
describes. The write records it in the ledger; the append verifies the staged files against it
and commits its description into the Delta log; ``check`` and ``check --verify`` read it back
from either. Serialized in one place (:meth:`Manifest.to_json`, :meth:`Manifest.commit_meta`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from reconcile.kinds.refresh import Refresh
from reconcile.model import FeedProgress

LAYOUT = "batches"  # the staged files live inside the table's directory (storage.layout)


class ManifestUnreadable(ValueError):
    """The text is not a manifest (damaged, or not one at all)."""


@dataclass(frozen=True)
class Part:
    """One hash partition of a batch. ``files``/``digests``: paths relative to the attempt's
    directory. The checksums of the desired collection and of the shard after the correction as
    of ``upper - 1`` are absent when they could not be summed exactly (or self-checks are off)."""

    rows: int = 0
    checksum: str = "0"
    err: int | None = None
    weight: int | None = None
    net: int | None = None
    files: dict[str, int] | None = None
    digests: dict[str, str] | None = None
    desired_checksum: str | None = None
    shard_checksum: str | None = None

    @property
    def has_checksums(self) -> bool:
        """Did the write record this partition's checksums of the shard?"""
        return self.desired_checksum is not None and self.shard_checksum is not None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, raw: dict) -> Part:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class Rewrite:
    """The shard rewritten into the sink file's schema, staged with the batch that applies it
    (:mod:`reconcile.sink.evolve`): the Delta version it projects (the append commits it as the
    version right after that one, removing every file of it), the schema change, its files
    (paths relative to the attempt's directory) with sizes and digests, and its rows."""

    read_version: int
    change: str
    rows: int
    files: dict[str, int]
    digests: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, raw: Any) -> Rewrite | None:
        if not isinstance(raw, dict):
            return None
        return cls(
            int(raw["read_version"]),
            str(raw["change"]),
            int(raw["rows"]),
            {str(k): int(v) for k, v in raw["files"].items()},
            raw.get("digests"),
        )


@dataclass(frozen=True)
class Manifest:
    batch_id: str
    lower: int
    upper: int
    partitions: int
    parts: dict[int, Part]
    stage_id: str | None = None
    read_version: int | None = None
    # a command feed's progress (upsert): eligible and late commands, the feed's highest offset;
    # serialized as the flat keys of FeedProgress.to_dict
    feed: FeedProgress | None = None
    # what the batch repaired of foreign writes (reconcile.sink.drift): the foreign versions, how
    # (rows, keys, all keys), the keys an upsert feed cannot define
    drift: dict[str, Any] | None = None
    # the version of each Delta source a query batch read, by the source's name
    sources: dict[str, int] | None = None
    query_digest: str | None = None  # what the sink file said the batch computes (a query's)
    # the way a query batch took: from its sources' changes or in full, and why (kinds.refresh)
    refresh: Refresh | None = None
    rewrite: Rewrite | None = None  # the shard rewritten into the sink file's schema, in the batch's commit
    # what the hash partitions hash (reconcile.differential.partitioned_by): "key" for an upsert
    # sink's batches written by key, None (every row's columns) otherwise
    partitioned_by: str | None = None

    # -- what it says ---------------------------------------------------------------------------

    @property
    def rows_err(self) -> int:
        return sum(p.err or 0 for p in self.parts.values())

    @property
    def rows_ok(self) -> int:
        return sum(p.rows for p in self.parts.values()) - self.rows_err

    @property
    def rows_net(self) -> int:
        return sum(p.net or 0 for p in self.parts.values())

    def change(self) -> tuple[int, int] | None:
        """(inserted, retracted) rows; None when a partition does not record weight and net."""
        if any(p.net is None or p.weight is None for p in self.parts.values()):
            return None
        weight = sum(p.weight or 0 for p in self.parts.values())
        return (weight + self.rows_net) // 2, (weight - self.rows_net) // 2

    def refresh_text(self) -> str | None:
        """The way the batch took, as one short phrase (:meth:`Refresh.text`; None: not a query
        batch that recorded it)."""
        if self.refresh is None:
            return None
        weights = [p.weight for p in self.parts.values()]
        return self.refresh.text(None if None in weights else sum(w or 0 for w in weights))

    def staged_files(self) -> dict[str, int]:
        """{path relative to the attempt's directory: size} of every file of the batch."""
        out: dict[str, int] = dict(self.rewrite.files) if self.rewrite else {}
        for part in self.parts.values():
            out.update(part.files or {})
        return out

    # -- serialized -----------------------------------------------------------------------------

    @property
    def partitioning(self) -> tuple[int, str | None]:
        """(P, what the partitions hash): the checksums of two batches add up only if both agree."""
        return self.partitions, self.partitioned_by

    def to_dict(self) -> dict[str, Any]:
        feed = FeedProgress.flat(self.feed)
        out: dict[str, Any] = {
            "batch_id": self.batch_id,
            "stage_id": self.stage_id,
            "layout": LAYOUT,
            "lower": self.lower,
            "upper": self.upper,
            "partitions": self.partitions,
            "read_version": self.read_version,
            "parts": {str(p): part.to_dict() for p, part in sorted(self.parts.items())},
            **feed,
            "drift": self.drift,
            "sources": self.sources,
            "query_digest": self.query_digest,
            "refresh": self.refresh.to_dict() if self.refresh is not None else None,
            "rewrite": self.rewrite.to_dict() if self.rewrite else None,
            "partitioned_by": self.partitioned_by,
        }
        return {k: v for k, v in out.items() if v is not None or k in ("stage_id", "read_version", *feed)}

    def to_json(self) -> str:
        """The ledger's text of the manifest."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def commit_meta(self) -> dict[str, Any]:
        """What the batch's Delta commit records of it: the description ``check`` verifies the
        version against, and the checksums ``check --verify`` recomputes."""
        keep = ("rows", "checksum", "files", "desired_checksum", "shard_checksum")
        return {
            **({"drift": self.drift} if self.drift is not None else {}),
            **({"sources": self.sources} if self.sources is not None else {}),
            **({"refresh": self.refresh.to_dict()} if self.refresh is not None else {}),
            **(
                {"rewrite": {k: v for k, v in self.rewrite.to_dict().items() if k != "digests"}} if self.rewrite else {}
            ),
            "stage_id": self.stage_id,
            "layout": LAYOUT,
            "partitions": self.partitions,
            **({"partitioned_by": self.partitioned_by} if self.partitioned_by is not None else {}),
            "parts": {
                str(p): {k: v for k, v in part.to_dict().items() if k in keep} for p, part in sorted(self.parts.items())
            },
        }

    @classmethod
    def from_dict(cls, raw: dict) -> Manifest:
        try:
            return cls(
                batch_id=str(raw["batch_id"]),
                lower=int(raw["lower"]),
                upper=int(raw["upper"]),
                partitions=int(raw["partitions"]),
                parts={int(p): Part.from_dict(part) for p, part in raw["parts"].items()},
                stage_id=raw.get("stage_id"),
                read_version=raw.get("read_version"),
                feed=FeedProgress.from_dict(raw),
                drift=raw.get("drift") if isinstance(raw.get("drift"), dict) else None,
                sources=source_versions(raw),
                query_digest=raw.get("query_digest") if isinstance(raw.get("query_digest"), str) else None,
                refresh=Refresh.from_dict(raw.get("refresh")),
                rewrite=Rewrite.from_dict(raw.get("rewrite")),
                partitioned_by=raw.get("partitioned_by") if raw.get("partitioned_by") == "key" else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestUnreadable(str(exc)) from None

    @classmethod
    def from_json(cls, text: str | None) -> Manifest:
        try:
            raw = json.loads(text or "")
        except ValueError as exc:
            raise ManifestUnreadable(str(exc)) from None
        if not isinstance(raw, dict):
            raise ManifestUnreadable("not an object")
        return cls.from_dict(raw)

    @classmethod
    def described(cls, meta: dict, ledger_text: str | None) -> Manifest | None:
        """A committed batch's description: its Delta commit's metadata (``meta``), completed by
        the ledger's manifest where the commit does not carry the parts; None if neither does."""
        raw = dict(meta)
        if "parts" not in raw or "partitions" not in raw:
            try:
                raw = {**json.loads(ledger_text or "{}"), **{k: v for k, v in meta.items() if k != "parts"}}
            except ValueError:
                return None
        if "parts" not in raw or "partitions" not in raw:
            return None
        try:
            return cls.from_dict(raw)
        except ManifestUnreadable:
            return None


def source_versions(raw: dict | str | None) -> dict[str, int] | None:
    """The Delta source versions a manifest (its dict or the ledger's text of it) records, by
    source name; None when it records none (not a query over Delta sources, or an older batch)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    found = raw.get("sources") if isinstance(raw, dict) else None
    if not isinstance(found, dict):
        return None
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int)}
