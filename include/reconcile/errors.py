"""Typed failures of the sink.

Every failure the operator may see names the sink, the cause and the remedy, in one line
(``str(exc)``). Airflow tasks map these onto retry behaviour: a :class:`Retryable` failure is
worth an automatic retry (a database that was briefly unreachable, a Spark executor lost),
everything else fails the task at once because retrying cannot change the outcome.
"""

from __future__ import annotations


def brief(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's text (Spark's are long and start with '\n')."""
    for line in str(exc).splitlines():
        if line.strip():
            return " ".join(line.split())[:limit]
    return type(exc).__name__


class SinkError(Exception):
    """Base class. ``remedy`` says what the operator should do."""

    remedy: str = ""

    def __init__(self, message: str, *, sink: str | None = None, remedy: str | None = None):
        self.sink = sink
        if remedy is not None:
            self.remedy = remedy
        prefix = f"sink {sink!r}: " if sink else ""
        text = f"{prefix}{message}"
        if self.remedy:
            text = f"{text} Remedy: {self.remedy}"
        super().__init__(text)


class Retryable(SinkError):
    """A transient failure: retrying the same task may succeed."""


class ConfigError(SinkError):
    """A sink config file is invalid. Names the file and field."""

    remedy = "fix the named field in the config file; nothing was written."

    def __init__(self, path: str, field: str, message: str, *, sink: str | None = None):
        self.path = path
        self.field = field
        super().__init__(f"config {path}: field '{field}': {message}", sink=sink)


class SourceError(SinkError):
    """The desired collection cannot be read or does not match the sink's schema."""

    remedy = (
        "fix the source (or the sink's schema/query in its config file), then clear the run's "
        "'write' task; nothing was committed."
    )


class MetadataUnavailable(Retryable):
    remedy = (
        "check RECONCILE_METADATA_URL and that the database is up; the task retries by itself, "
        "nothing was committed by this attempt."
    )


class SchemaRecreated(MetadataUnavailable):
    """The ledger's tables were gone (a dropped schema, a replaced database file) and were
    created again; the store's entry points retry once, so a shard is rebuilt from its log."""

    remedy = (
        "nothing to repair: the task retries by itself and rebuilds the shard from its Delta log "
        "(`python -m reconcile recover SINK` does it now)."
    )


class ShardNotFound(SinkError):
    remedy = (
        "run the sink's 'mint' task first (it creates the shard row), or check the sink name; a lost "
        "metadata database is rebuilt from the Delta log by `python -m reconcile recover SINK`."
    )


class MetadataAheadOfLog(SinkError):
    """The ledger records batch commits the Delta log does not hold (the table was restored from
    an older copy, or replaced): writing on would use a lower the table does not end at."""


class BatchNotFound(SinkError):
    remedy = "clear the whole DAG run so that 'mint' describes a new batch."


class UpperMismatch(SinkError):
    """A compare-and-set on the shard's upper found another value."""

    def __init__(self, sink: str, expected: int, current: int | None):
        self.expected = expected
        self.current = current
        super().__init__(
            f"shard upper is {current}, expected {expected}",
            sink=sink,
            remedy="another writer moved the shard; the next run reconciles.",
        )


class DescriptionOutdated(SinkError):
    """The batch can never be appended: the shard moved past its lower."""

    remedy = (
        "nothing to repair: the next scheduled run (or clearing this whole DAG run) computes the "
        "correction against the shard's new contents."
    )


class LostRace(DescriptionOutdated):
    """Another writer committed this batch's lower with a smaller upper."""


class StagedBatchInvalid(SinkError):
    """Staged parts are missing, corrupted or disagree with the manifest."""

    remedy = "clear the run's 'write' task (it re-stages the batch), then 'append'."


class ShardSchemaChanged(SinkError):
    remedy = (
        "the Delta table's schema was changed behind the sink's back: restore it (Delta RESTORE to "
        "the last version the sink committed) or change the sink's schema and re-create the shard."
    )


class InconsistentState(SinkError):
    remedy = "stop writers of this sink and inspect the ledger with `python -m reconcile status`."


class FailPointHit(Retryable):
    """Raised by an armed fail point (tests only)."""


class CorrectionBlocked(SinkError):
    """A batch would change more of the shard than the sink's correction guard allows."""
