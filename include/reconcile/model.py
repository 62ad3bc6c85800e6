"""The protocol's vocabulary: batch descriptions, commit records, a command feed's progress,
ledger states and outcomes.

Plain values shared by every layer; this module imports nothing of the sink.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol

# The row key every update the sink writes carries (two BIGINTs: a row's 128-bit key, the
# first half its row hash ``xxhash64(row, _error)``, the second a salted hash): hidden columns of
# the shard after ``_time``, ``_diff``, ``_error`` (docs/design.md, "The row key stored").
ROW_KEYS: tuple[str, str] = ("_rowkey1", "_rowkey2")


class BatchState(StrEnum):
    """A description's life in the ledger: minted -> staged -> committed; an open (minted or
    staged) description that can never be appended is superseded."""

    MINTED = "minted"
    STAGED = "staged"
    COMMITTED = "committed"
    SUPERSEDED = "superseded"


MINTED, STAGED, COMMITTED, SUPERSEDED = BatchState
OPEN_STATES: tuple[str, ...] = (MINTED, STAGED)


class FailureKind(StrEnum):
    """A batch's last failure: retrying cannot help (``final``) or the task's retry may."""

    FINAL = "final"
    RETRYABLE = "retryable"


FINAL, RETRYABLE = FailureKind


class Outcome(StrEnum):
    """How a stage ended (equal to its string value, which the messages and tests use)."""

    STAGED = "staged"  # write: this attempt's files are the batch
    ALREADY_STAGED = "already_staged"  # write: another attempt's files are the batch
    SKIPPED = "skipped"  # write: the batch is committed or no longer open
    OUTDATED = "outdated"  # write: another writer moved the shard past lower; nothing to append
    COMMITTED = "committed"  # append: this attempt committed the batch
    RECOVERED = "recovered"  # append: an earlier attempt had committed it; metadata rolled forward
    ALREADY_COMMITTED = "already_committed"  # append: committed before (or by another attempt meanwhile)
    COVERED = "covered"  # append: another batch committed [lower, upper) already
    SUPERSEDED = "superseded"  # append: a newer description of lower covers this one
    COMPACTED = "compacted"  # compact: the history before the new since consolidated
    NOTHING = "nothing"  # compact: nothing to do (no table, no batch, since already there)
    RACED = "raced"  # compact: a batch committed after it read; nothing committed
    REBUILT = "rebuilt"  # recover: the lost shard row rebuilt; current table: written whole
    ROLLED_FORWARD = "rolled_forward"  # recover: the metadata rolled forward to the Delta log
    IN_SYNC = "in_sync"  # recover: the metadata already agreed
    RESET = "reset"  # recover: the shard's Delta table is gone; the metadata reset
    APPLIED = "applied"  # current table: the batches since the version it reflected applied
    UP_TO_DATE = "up_to_date"  # current table: it already reflected the shard's latest version


class _BatchRow(Protocol):
    shard: str
    batch_id: str
    lower: int
    upper: int
    run_id: str | None
    attempt: int


@dataclass(frozen=True)
class BatchDescription:
    """``(lower, upper)`` plus the identity of the run that minted it."""

    sink: str
    batch_id: str
    lower: int
    upper: int
    run_id: str | None
    attempt: int

    def __post_init__(self) -> None:
        assert self.lower < self.upper, f"invalid batch description {self}: lower >= upper"

    @classmethod
    def of(cls, b: _BatchRow) -> BatchDescription:
        return cls(b.shard, b.batch_id, b.lower, b.upper, b.run_id, b.attempt)


@dataclass(frozen=True)
class FeedProgress:
    """What a batch of a kind that reads a command feed records of it (the manifest, the ledger,
    the Delta commit, the log): the commands eligible in the batch, how many of them are late, and
    the feed's highest offset read (the next batch's watermark; None: the feed had none).

    The kind's correction (:class:`reconcile.kinds.Correction`) knows all three, and the manifest
    records all three. The ledger and the Delta commit metadata record only ``late_commands`` and
    ``source_offset`` (:meth:`recorded`): ``commands`` is None there, and so is ``late_commands``
    in a record that lacks it (the ledger's two columns are nullable each on its own).

    Serialized as flat keys of the manifest and of the ``staged batch`` log line (:meth:`to_dict`,
    :meth:`from_dict`)."""

    KEYS: ClassVar[tuple[str, ...]] = ("commands", "late_commands", "source_offset")  # the flat keys, in order

    commands: int | None
    late_commands: int | None
    source_offset: int | None

    def to_dict(self) -> dict[str, int | None]:
        """The flat keys (a None kept)."""
        return {k: getattr(self, k) for k in self.KEYS}

    @staticmethod
    def flat(feed: FeedProgress | None) -> dict[str, int | None]:
        """The flat keys of ``feed``; none without a feed (a kind that reads none)."""
        return {} if feed is None else feed.to_dict()

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FeedProgress | None:
        """The progress the flat keys of ``raw`` record (a manifest's); None when it holds none of
        them (another kind's, or a manifest older than feeds)."""
        if not any(k in raw for k in cls.KEYS):
            return None
        return cls(raw.get("commands"), raw.get("late_commands"), raw.get("source_offset"))

    @classmethod
    def recorded(cls, late_commands: int | None, source_offset: int | None) -> FeedProgress | None:
        """The progress a ledger row or a Delta commit records (no ``commands``); None when it
        records neither."""
        if late_commands is None and source_offset is None:
            return None
        return cls(None, late_commands, source_offset)


@dataclass(frozen=True)
class CommitRecord:
    """A batch commit as recorded in a Delta version's commit metadata."""

    version: int
    batch_id: str
    lower: int
    upper: int
    run_id: str | None = None
    rows_ok: int | None = None
    rows_err: int | None = None
    feed: FeedProgress | None = None  # a command feed's progress (FeedProgress.recorded: no commands)
    stage_id: str | None = None  # the write attempt whose files the version added

    def summary(self) -> dict:
        """The fields a log line shows."""
        return {"batch": self.batch_id, "lower": self.lower, "upper": self.upper, "delta_version": self.version}


@dataclass(frozen=True)
class Staged:
    """What a write attempt staged, as the ledger records it: the attempt (``stage_id``, the
    directory of its files), its manifest (files, sizes, rows and checksum per partition) and
    the batch's counts."""

    stage_id: str
    manifest: str  # its JSON text (reconcile.manifest.Manifest.to_json)
    rows_ok: int
    rows_err: int
    read_version: int
    drift_rows: int | None
    feed: FeedProgress | None = None  # a command feed's progress (the ledger keeps all but commands)
    rows_net: int | None = None  # sum of the correction's diffs: how the shard's size changes

    def summary(self) -> dict:
        """The fields a log line shows."""
        return {
            "stage": self.stage_id,
            "rows_ok": self.rows_ok,
            "rows_err": self.rows_err,
            "drift_rows": self.drift_rows,
            "read_version": self.read_version,
        }
