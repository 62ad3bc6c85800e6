"""Typed failures of the sink.

Every failure the operator may see names the sink, the cause and the remedy, in one line
(``str(exc)``). Airflow tasks map these onto retry behaviour: a :class:`Retryable` failure is
worth an automatic retry (a database that was briefly unreachable, a Spark executor lost),
everything else fails the task at once because retrying cannot change the outcome.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in _ANSI.sub("", text).splitlines() if line.strip()]


def _underlying(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` was raised from or during (not one hidden by ``raise ... from None``)."""
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


# A path or URL: a token of 2+ slashes (or backslashes), or one with a scheme (s3://, file:/).
_PATHLIKE = re.compile(r"\S*(?:[/\\]\S*){2,}|\w+:/\S+")
PATH_WIDTH = 80  # what a shortened path keeps: its start and its last components


def short_path(path: str, width: int = PATH_WIDTH) -> str:
    """``path`` (a file path or URL) in at most ``width`` characters, cut in its middle at
    separators: ``/data/very/…/dir/file.json``. Its start (the root, a URL's scheme and bucket)
    and its last components (the file, the folder it is in) are what tell one path from another;
    the middle is where a deep tree's names repeat. A name too long for that is cut in its own
    middle."""
    if len(path) <= width:
        return path
    keep = width - 2  # for "…/" (or "…" alone)
    pieces = [p for p in re.split(r"(?<=[/\\])", path) if p]  # each but the last ends on its separator
    if len(pieces[-1]) > keep * 3 // 5:  # the last name alone is too long: cut by characters
        head_n = keep * 2 // 5
        return f"{path[:head_n]}…{path[len(path) - (keep + 1 - head_n) :]}"
    root = "".join(pieces[: 3 if "://" in path else 2])  # s3://bucket/, /data/
    budget = min(keep * 3 // 5, keep - (len(root) if len(root) <= keep // 2 else 0))
    i = len(pieces) - 1
    while i > 1 and len(pieces[i - 1]) + sum(map(len, pieces[i:])) <= budget:
        i -= 1
    tail = "".join(pieces[i:])
    head, j = "", 0
    while j < i and len(head) + len(pieces[j]) + len(tail) <= keep:
        head += pieces[j]
        j += 1
    if len(head) < min(len(root), keep // 2):  # a long first name: its start rather than nothing
        return f"{path[: keep + 1 - len(tail)]}…{tail}"
    return f"{head}…{head[-1]}{tail}"


def _short_paths(text: str, width: int = PATH_WIDTH) -> str:
    return _PATHLIKE.sub(lambda m: short_path(m.group(0), width), text)


def shorten(text: str, limit: int = 300, path_width: int = PATH_WIDTH) -> str:
    """``text`` on one line in at most ``limit`` characters: first each path or URL longer than
    ``path_width`` is cut in its middle (:func:`short_path`; narrower if that is not enough),
    then, if the text is still too long, its own middle (between words where it can). Its start
    (what failed) and its end (why: the reason, the error class, the root cause) are never cut;
    a text within ``limit`` is returned as it is (on one line)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    for width in (path_width, path_width // 2, 24):  # narrower while the text is too long
        text = _short_paths(text, width)
        if len(text) <= limit:
            return text
    head_n = (limit - 3) // 2
    head, tail = text[:head_n], text[len(text) - (limit - 3 - head_n) :]
    if " " in head[head_n // 2 :]:  # cut between words where one is near
        head = head.rsplit(" ", 1)[0]
    if " " in tail[: len(tail) // 2]:
        tail = tail.split(" ", 1)[1]
    return f"{head} … {tail}"


def brief(exc: BaseException, limit: int = 300) -> str:
    """One line saying why: the first line of the exception's text (Spark's are long and start
    with '\n'), followed by the underlying cause it hides, so "Generic LocalFileSystem error"
    reads "Generic LocalFileSystem error: Unable to open file ...: Operation not permitted (os
    error 1)". The causes come from the text (delta-rs lists its sources on lines starting with
    ``↳``; a JVM's trace has ``Caused by:`` lines, the last one the root) and from the Python
    exception chain (``__cause__``/``__context__``). Past ``limit`` long paths are cut in their
    middle (:func:`shorten`), then the middle of the chain, never the first line's start nor the
    root cause (its reason and error class, ``[PATH_NOT_FOUND] Path does not exist: ...``)."""
    lines = _lines(str(exc))
    if not lines:
        lines = [type(exc).__name__]
    head, causes = lines[0], []
    sources = [ln.removeprefix("↳").strip() for ln in lines[1:] if ln.startswith("↳")]
    if sources:
        causes = sources
    else:
        jvm = [ln.removeprefix("Caused by:").strip() for ln in lines[1:] if ln.startswith("Caused by:")]
        causes = jvm[-1:]
    seen: set[int] = {id(exc)}
    inner = _underlying(exc)
    while inner is not None and id(inner) not in seen:  # the Python chain, innermost last
        seen.add(id(inner))
        text = (_lines(str(inner)) or [type(inner).__name__])[0]
        if text not in head and all(text not in c for c in causes):
            causes.append(text)
        inner = _underlying(inner)
    parts = [head] + [c for c in causes if c and c not in head]
    out = ": ".join(parts)
    if len(out) <= limit:
        return out
    parts = [_short_paths(p) for p in parts]
    if len(parts) == 1 or len(": ".join(parts)) <= limit:
        return shorten(": ".join(parts), limit)
    root = shorten(parts[-1], limit // 2)
    return f"{shorten(': '.join(parts[:-1]), limit - len(root) - 2)}: {root}"


class SinkError(Exception):
    """Base class. ``remedy`` says what the operator should do; ``rerun`` which of the run's
    tasks to rerun once the cause is fixed (``None``: the failed task itself, ``"write"``: stage
    the batch anew, ``""``: none). A task adds the complete command for its run
    (:meth:`add_remedy`, with :mod:`reconcile.remedy`)."""

    remedy: str = ""
    rerun: str | None = None

    def __init__(self, message: str, *, sink: str | None = None, remedy: str | None = None):
        self.sink = sink
        self.message = message
        if remedy is not None:
            self.remedy = remedy
        else:  # a class's remedy names the sink as {sink}
            self.remedy = self.remedy.replace("{sink}", sink or "SINK")
        super().__init__(self._text())

    def _text(self) -> str:
        prefix = f"sink {self.sink!r}: " if self.sink else ""
        text = f"{prefix}{self.message}"
        return f"{text} Remedy: {self.remedy}" if self.remedy else text

    def add_remedy(self, more: str) -> None:
        """End the remedy with ``more`` (the commands for the run that failed)."""
        self.remedy = f"{self.remedy} {more}" if self.remedy else more
        self.args = (self._text(),)


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

    remedy = "fix the source (or the sink's schema/query in its config file); nothing was committed."


class MetadataUnavailable(Retryable):
    remedy = (
        "check RECONCILE_METADATA_URL and that the database is up; the task retries by itself, "
        "nothing was committed by this attempt."
    )


class SchemaRecreated(MetadataUnavailable):
    """The ledger's tables were gone (a dropped schema, a replaced database file) and were
    created again; the ledger's entry points retry once, so a shard is rebuilt from its log."""

    remedy = "nothing to repair: the task retries by itself and rebuilds the shard from its Delta log."


class ShardNotFound(SinkError):
    remedy = (
        "check the sink's name; a sink's first run creates its shard row "
        "(`airflow dags unpause {sink} && airflow dags trigger {sink}`), "
        "a lost ledger database is rebuilt from the Delta log by `python -m reconcile recover {sink}`."
    )


class MetadataAheadOfLog(SinkError):
    """The ledger records batch commits the Delta log does not hold (the table was restored from
    an older copy, or replaced): writing on would use a lower the table does not end at."""


class BatchNotFound(SinkError):
    remedy = "a new run's mint describes a new batch."
    rerun = "write"


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

    remedy = "nothing to repair: the next run computes the correction against the shard's new contents."
    rerun = ""


class LostRace(DescriptionOutdated):
    """Another writer committed this batch's lower with a smaller upper."""


class StagedBatchInvalid(SinkError):
    """Staged parts are missing, corrupted or disagree with the manifest."""

    remedy = "stage the batch anew."
    rerun = "write"


class ShardSchemaChanged(SinkError):
    remedy = (
        "the Delta table's schema was changed behind the sink's back: restore it (Delta RESTORE to "
        "the last version the sink committed) or change the sink's schema and re-create the shard."
    )


class SinkSchemaChange(SinkError):
    """The sink file changes the shard's columns in a way no run applies (issue 52): the
    message names each change and why it is refused."""

    remedy = (
        "keep the shard's columns in the sink file (`python -m reconcile validate` compares them), or move the "
        "new schema to a new sink (a new name: its first batch writes the whole result; the old shard keeps its "
        "history); nothing was written."
    )


class InconsistentState(SinkError):
    remedy = (
        "stop the sink's writers and inspect its ledger and log: `python -m reconcile status {sink}`, "
        "`python -m reconcile check {sink}`."
    )
    rerun = ""


class FailPointHit(Retryable):
    """Raised by an armed fail point (tests only)."""


class CorrectionBlocked(SinkError):
    """A batch would change more of the shard than the sink's correction guard allows."""


class StorageError(SinkError):
    """The warehouse refused a write for a reason retrying does not change (permissions, a
    read-only or full file system, an access-denied bucket): final, with the path and the OS's
    error in one line."""


# (pattern over an exception's whole text, what it says); the first group, if any, is the path
_STORAGE = (
    (re.compile(r"Mkdirs failed to create (\S+)"), "cannot create the directory"),
    (re.compile(r"(?:java\.nio\.file\.)?AccessDeniedException: (\S+)"), "access denied"),
    (re.compile(r"(\S+) \(Permission denied\)"), "permission denied"),
    (re.compile(r"Permission denied(?: \(os error 13\))?"), "permission denied"),
    (re.compile(r"Read-only file system"), "read-only file system"),
    (re.compile(r"No space left on device"), "no space left on device"),
    (re.compile(r"Operation not permitted"), "operation not permitted"),
)


def _os_reason(path: str) -> str:
    """The OS's answer for writing under ``path`` (a local path or file: URI): the nearest
    existing directory and why it cannot be written, or ""."""
    import errno
    import os
    import tempfile

    local = re.sub(r"^file:(//)?", "", path)
    if "://" in local:
        return ""
    d = local
    while d and not os.path.isdir(d):
        d = os.path.dirname(d.rstrip("/")) if d != "/" else ""
    if not d:
        return ""
    try:
        tempfile.TemporaryFile(dir=d).close()
    except OSError as exc:
        return f"{d}: {exc.strerror or errno.errorcode.get(exc.errno or 0, '')} (os error {exc.errno})"
    return ""


def storage_failure(exc: BaseException, sink: str | None = None) -> StorageError | None:
    """A :class:`StorageError` when ``exc`` (a Spark or delta-rs failure, whatever its chain) is
    the warehouse refusing a write; None otherwise (retrying may help)."""
    text = "\n".join(str(e) for e in _chain(exc))
    for pattern, what in _STORAGE:
        found = pattern.search(text)
        if found is None:
            continue
        path = found.group(1).rstrip(".,;:)") if found.groups() else None
        os_reason = _os_reason(path) if path else ""
        where = f" {path}" if path else ""
        why = f": {os_reason}" if os_reason else f" ({brief(exc, 200)})"
        return StorageError(
            f"the warehouse refused a write ({what}){where}{why}",
            sink=sink,
            remedy="make the warehouse writable for the user the Spark jobs run as (or free space), then rerun the "
            "task; retrying without that fails the same way.",
        )
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    out, seen = [], set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(e)
        e = e.__cause__ or e.__context__
    return out
