"""A shard's Delta table, without a JVM: one :class:`ShardTable` per sink, built once per stage,
with the verbs the stages use (its staging area, its log since a version, its files, the guarded
commits, vacuum). delta-rs reads snapshots and makes every commit; fsspec reads files; pyarrow
reads Parquet footers (:mod:`.footers`). The layout of the files is in :mod:`.layout`, the
meaning of each commit in :mod:`.commits`.

Every commit the sink makes is one delta-rs commit of files already on storage, at exactly the
version after the snapshot it read (put-if-absent of ``_delta_log/<version>.json``, no automatic
retry): :meth:`ShardTable._commit_at_next`. Batch commits record the application transaction
``(appId = reconcile-sink:<sink>, version = lower)``: a batch is committed only if the last
version recorded for that app id is below its ``lower`` (else the commit re-checks on the newer
snapshot), so a batch, or any batch with an older ``lower``, can never be committed twice. A
compaction's rewrite is committed only as the version right after the one it read, never later.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from reconcile import settings
from reconcile.config import SinkConfig
from reconcile.errors import Retryable, ShardSchemaChanged, SinkError, SinkSchemaChange, StagedBatchInvalid, brief
from reconcile.log import iso
from reconcile.model import ROW_KEYS
from reconcile.storage import files, schema_change
from reconcile.storage.commits import (
    MAINTENANCE,
    META_KEY,
    ForeignCommit,
    describe_commit,
    info_of,
    parse_actions,
)
from reconcile.storage.layout import BATCHES_DIR, COMPACTIONS_DIR
from reconcile.storage.schema_change import delta_type

# Reader features that leave every data file readable as it is, by name (Spark reads timestamp_ntz
# columns from Parquet itself).
_PLAIN_READER_FEATURES = {"timestampNtz"}
# Characters a Hadoop path would take for a glob or a URI part.
_NOT_PLAIN = set("*?[]{}\\:")

# One log entry: (version, describe_commit of its actions, the txnVersion it records for the
# sink's commit guard or None).
LogEntry = tuple[int, dict | None, int | None]


class CommitRejected(SinkError):
    """The Delta table refuses the commit for a reason retrying cannot change (its protocol)."""


class ShardTable:
    """The Delta table of one sink's shard under the warehouse (``RECONCILE_WAREHOUSE``)."""

    def __init__(self, cfg: SinkConfig, warehouse: str | None = None):
        self.cfg = cfg
        self.name = cfg.name
        self.path = f"{warehouse or settings.warehouse()}/{cfg.name}"
        self.log_path = f"{self.path}/_delta_log"
        self.staging_root = f"{self.path}/{BATCHES_DIR}"
        self.app_id = f"reconcile-sink:{cfg.name}"
        # delta-rs's options beyond the AWS environment it reads itself (no secret in them)
        self.storage_options = settings.delta_storage_options()
        self._latest: Any = None  # the latest delta-rs snapshot loaded, refreshed incrementally
        self._pinned: tuple[int, Any] | None = None  # the last snapshot loaded at an explicit version
        self._texts: dict[int, str] | None = None  # commit files read, once :meth:`remember_commits`

    def __repr__(self) -> str:
        return f"ShardTable({self.path!r})"

    # -- staging ------------------------------------------------------------------------------

    def staging_path(self, batch_id: str, stage_id: str | None = None) -> str:
        """The batch's staging directory, or one write attempt's directory inside it."""
        path = f"{self.staging_root}/{batch_id}"
        return f"{path}/{stage_id}" if stage_id else path

    def staged_batches(self) -> list[str]:
        """The batch ids that have a staging directory."""
        return files.list_dirs(self.staging_root)

    def staged_attempts(self, batch_id: str) -> list[str]:
        """The write attempts (stage ids) staged for one batch."""
        return files.list_dirs(self.staging_path(batch_id))

    def staged_dirs(self) -> dict[str, list[str]]:
        """{batch id: its write attempts (stage ids)} of every staging directory, from one
        listing of the staging area (not one per batch)."""
        return files.list_subdirs(self.staging_root)

    def files(self) -> dict[str, int]:
        """{path relative to the table: size} of every data file under the table's directory."""
        return files.list_files(self.path)

    # -- the log ------------------------------------------------------------------------------

    def log_versions(self) -> list[int]:
        """The versions of the shard's Delta log, ascending (:func:`log_versions`)."""
        return log_versions(self.log_path)

    def exists(self) -> bool:
        return bool(self.log_versions())

    def _committed_versions(self) -> list[int]:
        versions = self.log_versions()
        if not versions:
            raise Retryable(f"the Delta table at {self.path} has no commits", sink=self.name)
        return versions

    def latest_version(self) -> int:
        return self._committed_versions()[-1]

    def remember_commits(self) -> None:
        """Keep each commit file read by this object, to read it once for a pass over the log at
        one moment (``check``). Not for a stage that commits: it re-reads a version to see that
        it still holds what the ledger absorbed."""
        if self._texts is None:
            self._texts = {}

    def _commit_text(self, version: int) -> str | None:
        return self._commit_texts([version])[version]

    def _commit_texts(self, versions: list[int]) -> dict[int, str | None]:
        """{version: its commit file's text, None if gone}; several read at once (on an object
        store each read is a round trip: a log of hundreds of versions is read in parallel)."""
        from concurrent.futures import ThreadPoolExecutor

        known = self._texts if self._texts is not None else {}
        todo = [v for v in versions if v not in known]

        def read(v: int) -> str | None:
            return files.read_text(f"{self.log_path}/{v:020d}.json")

        if len(todo) > 1:
            with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
                got = dict(zip(todo, pool.map(read, todo), strict=True))
        else:
            got = {v: read(v) for v in todo}
        if self._texts is not None:
            self._texts.update({v: t for v, t in got.items() if t is not None})
        return {v: known[v] if v in known else got[v] for v in versions}

    def commit_actions(self, version: int) -> list[dict]:
        """The actions of one Delta version, read from its commit file."""
        text = self._commit_text(version)
        if text is None:  # listed a moment ago: removed by Delta's log cleanup meanwhile
            raise Retryable(f"Delta commit file of version {version} under {self.log_path} is gone", sink=self.name)
        return parse_actions(text)

    def commit_info(self, version: int) -> dict:
        """The ``commitInfo`` action of one Delta version."""
        return info_of(self.commit_actions(version))

    def _guard_txn(self, actions: list[dict]) -> int | None:
        return next((int(a["txn"]["version"]) for a in actions if a.get("txn", {}).get("appId") == self.app_id), None)

    def version_description(self, version: int) -> tuple[bool, dict | None]:
        """(whether the log holds the commit file of ``version``, its ``describe_commit``): one
        small read, to tell whether a version is still the commit the ledger recorded."""
        text = self._commit_text(version)
        if text is None:
            return False, None
        return True, describe_commit(parse_actions(text))

    def log_entries(self, after: int) -> tuple[int, list[LogEntry]]:
        """(latest version, the :data:`LogEntry` of each version > after, ascending)."""
        versions = self._committed_versions()
        texts = self._commit_texts([v for v in versions if v > after])
        entries = []
        for v, text in texts.items():
            if text is None:  # listed a moment ago: removed by Delta's log cleanup meanwhile
                raise Retryable(f"Delta commit file of version {v} under {self.log_path} is gone", sink=self.name)
            actions = parse_actions(text)
            entries.append((v, describe_commit(actions), self._guard_txn(actions)))
        return versions[-1], entries

    def history_since(self, after: int) -> tuple[int, list[tuple[int, dict | None]]]:
        """(latest version, [(version, ``describe_commit``)] for versions > after, ascending)."""
        latest, entries = self.log_entries(after)
        return latest, [(v, meta) for v, meta, _ in entries]

    def foreign_commits(self, after: int, up_to: int) -> list[ForeignCommit]:
        """The Delta versions in (after, up_to] that are not this sink's and changed data (drift),
        with who made them, from the log's commit files alone. A commit file removed by the log's
        cleanup meanwhile is skipped."""
        out = []
        for v, text in self._commit_texts([v for v in self.log_versions() if after < v <= up_to]).items():
            if text is None:
                continue
            actions = parse_actions(text)
            if describe_commit(actions) is None:
                out.append(ForeignCommit.of(v, actions))
        return out

    def rekeyed_at(self) -> int | None:
        """The latest version that rewrote the shard into a new schema with fresh row keys
        (:mod:`reconcile.sink.evolve`; None: none): the batches committed before it recorded
        checksums of the old columns, so ``check`` does not verify them."""
        versions = self.log_versions()
        texts = self._commit_texts(versions)
        for v in reversed(versions):
            text = texts[v]
            if text is not None and ((describe_commit(parse_actions(text)) or {}).get("rekeyed")):
                return v
        return None

    # -- snapshots ----------------------------------------------------------------------------

    def snapshot(self, version: int | None = None):
        """A delta-rs snapshot: the latest (kept and refreshed incrementally) or ``version`` (the
        last one asked for is kept: the write reads persist and tests it for emptiness at one
        version)."""
        from deltalake import DeltaTable

        if version is not None:  # a version's snapshot never changes: the last one is kept
            if self._pinned is None or self._pinned[0] != version:
                self._pinned = (version, DeltaTable(self.path, version=version, storage_options=self.storage_options))
            return self._pinned[1]
        if self._latest is None:
            self._latest = DeltaTable(self.path, storage_options=self.storage_options)
        else:
            self._latest.update_incremental()
        return self._latest

    def last_txn_version(self, as_of: int | None = None) -> int | None:
        """The last version the sink's commit guard recorded (application transaction of its app
        id) in the snapshot at Delta version ``as_of`` (default: the latest)."""
        return self.snapshot(as_of).transaction_version(self.app_id)

    def snapshot_files(self) -> list[str]:
        """The data files the latest snapshot names, relative to the table, decoded."""
        return _data_files(self.snapshot())

    def plain_files(self, version: int | None = None) -> list[str] | None:
        """The data files of the table at ``version`` (latest: None), as paths Spark reads as
        plain Parquet: one log replay in this process (delta-rs), no Spark job. None when the
        table must be read through Delta's own reader: deletion vectors, column mapping or any
        other reader feature; a file name Spark would take for a glob."""
        dt = self.snapshot(version)
        protocol = dt.protocol()
        plain = protocol.min_reader_version == 1 or (  # 2: column mapping, without a feature list
            protocol.min_reader_version == 3 and set(protocol.reader_features or ()) <= _PLAIN_READER_FEATURES
        )
        if not plain:
            return None
        names = _data_files(dt)
        if any(_NOT_PLAIN & set(n) or "://" in n or n.startswith("/") for n in names):
            return None
        return [f"{self.path}/{n}" for n in names]

    def keyed_files(self, version: int) -> tuple[list[str], list[str], int, int] | None:
        """The data files of the table at ``version`` as paths Spark reads as plain Parquet (None
        as :meth:`plain_files`), split into those whose stored row key a batch takes as stored and
        the others, with the update rows of each: ``(keyed, other, keyed rows, other rows)``.

        Keyed: written by the sink itself (under its batches' or compactions' directory, which
        no other writer writes to) with a key on every row (the file's statistics count no null
        in the key columns). A Parquet file is never changed once written, so the key each row of
        such a file carries is the one the sink computed from that row."""
        plain = self.plain_files(version)
        if plain is None:
            return None
        adds = self.snapshot(version).get_add_actions(flatten=True)
        names = adds.column_names
        paths = [unquote(p) for p in adds.column("path").to_pylist()]
        rows = adds.column("num_records").to_pylist()
        nulls = [adds.column(f"null_count.{k}").to_pylist() if f"null_count.{k}" in names else None for k in ROW_KEYS]
        keyed, other, n_keyed, n_other = [], [], 0, 0
        for i, (name, full) in enumerate(zip(paths, plain, strict=True)):
            own = name.startswith((f"{BATCHES_DIR}/", f"{COMPACTIONS_DIR}/"))
            if own and all(n is not None and n[i] == 0 for n in nulls) and rows[i] is not None:
                keyed.append(full)
                n_keyed += int(rows[i])
            else:
                other.append(full)
                n_other += int(rows[i] or 0)
        return keyed, other, n_keyed, n_other

    def files_holding(self, version: int, column: str, ranges: list) -> tuple[list[str], int] | None:
        """The data files at ``version`` (paths as :meth:`plain_files`; None as it) whose
        statistics bound ``column`` to a range that meets one of ``ranges`` (``(lo, hi)``,
        disjoint, ascending), and how many files the table has. A file whose statistics give no
        range is kept. No row is read."""
        plain = self.plain_files(version)
        if plain is None:
            return None
        adds = self.snapshot(version).get_add_actions(flatten=True)
        bounds = [f"min.{column}", f"max.{column}"]
        if not all(b in adds.column_names for b in bounds):
            return plain, len(plain)
        lows, highs = (adds.column(b).to_pylist() for b in bounds)
        tops = [hi for _, hi in ranges]
        kept = []
        for full, lo, hi in zip(plain, lows, highs, strict=True):
            i = bisect_left(tops, lo) if lo is not None else 0  # the first range ending at or after lo
            if lo is None or hi is None or (i < len(ranges) and ranges[i][0] <= hi):
                kept.append(full)
        return kept, len(plain)

    def row_diffs(self):
        """The ``_diff`` column of the latest snapshot (an Arrow array)."""
        import pyarrow as pa

        scan = self.snapshot().scan(columns=["_diff"])  # deletion vectors applied
        return pa.RecordBatchReader.from_stream(scan).read_all().column("_diff")

    # -- schema -------------------------------------------------------------------------------

    def _columns(self, keyed: bool = True) -> list[tuple[str, str]]:
        cols = [(c.name, delta_type(c.type)) for c in self.cfg.columns]
        cols += [("_time", "long"), ("_diff", "long"), ("_error", "string")]
        return cols + ([(k, "long") for k in ROW_KEYS] if keyed else [])

    def _fields(self, columns: list[tuple[str, str]]) -> list[dict]:
        keys = {k.lower() for k in getattr(self.cfg, "key_columns", ())}
        marked = {schema_change.KEY_META: True}  # an upsert key column: a change of the key is refused
        return [
            {"name": n, "type": t, "nullable": True, "metadata": marked if n.lower() in keys else {}}
            for n, t in columns
        ]

    def _schema_json(self) -> str:
        """The shard's Delta schema: the sink's columns, then ``_time``, ``_diff``, ``_error`` and
        the row key (:data:`~reconcile.model.ROW_KEYS`). Every column is nullable in the table
        (error rows null them; files written before the row key was stored hold none). An upsert
        sink's key columns carry :data:`.schema_change.KEY_META` in their field metadata."""
        return json.dumps({"type": "struct", "fields": self._fields(self._columns())})

    @property
    def keyed(self) -> bool:
        """Whether the table's schema has the row key columns (every shard created or upgraded
        since the row key is stored; :meth:`add_row_keys` upgrades one)."""
        names = {f["name"] for f in json.loads(self.snapshot().schema().to_json())["fields"]}
        return all(k in names for k in ROW_KEYS)

    def add_row_keys(self, fence: Callable[[], None] | None = None) -> int | None:
        """Add the row key columns to a shard created before they were stored: one metadata-only
        Delta version (no data file added or removed; the sink's ``maintenance`` commit
        metadata), made by the caller holding the commit lease (``fence`` checked right before).
        Rows of the files written before read the key as null (hashed when read). Returns the
        new version, or None when the table has them already."""
        from deltalake import CommitProperties
        from deltalake.schema import Field, PrimitiveType

        if self.keyed:
            return None
        if fence is not None:
            fence()
        dt = self.snapshot()
        meta = json.dumps({META_KEY: {"sink": self.name, "op": MAINTENANCE, "operation": "ADD ROW KEYS"}})
        dt.alter.add_columns(
            [Field(k, PrimitiveType("long"), nullable=True) for k in ROW_KEYS],
            commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}, max_commit_retries=0),
        )
        self._pinned = None
        return self.snapshot().version()

    def ensure(self, lease: Callable[[], Any] | None = None) -> None:
        """Create the table if missing (delta-rs: no JVM); refuse one whose schema drifted.
        Version 0 is one metadata-only commit, atomic by the put-if-absent of the first commit
        file: a concurrent creator loses that race with an error and then finds the table. It
        changes no data (a "maintenance" commit to ``describe_commit``).

        ``lease``: a context manager factory for the shard's commit lease
        (:meth:`reconcile.storage.lease.CommitLeases.commit_lease`), held around the creation and
        fenced right before its put, as around every other commit of the sink."""
        from contextlib import nullcontext

        attempt = 0
        while not self.exists():
            attempt += 1
            try:
                with lease() if lease is not None else nullcontext() as held:
                    if not self.exists():  # checked again inside the lease
                        if held is not None:
                            held.fence()
                        self._create()
            except SinkError:
                raise
            except Exception as exc:
                if self.exists():
                    break
                if attempt >= 5:
                    raise Retryable(
                        f"cannot create the shard's Delta table at {self.path}: {brief(exc, 300)}.",
                        sink=self.name,
                        remedy="the task retries by itself; if it persists, check the warehouse path.",
                    ) from None
                time.sleep(0.5 * attempt)
        self.check_schema()

    def _create(self) -> None:
        from deltalake import DeltaTable, Schema

        DeltaTable.create(
            self.path,
            schema=Schema.from_json(self._schema_json()),
            mode="error",
            name=self.name,
            storage_options=self.storage_options,
            configuration={"delta.checkpointInterval": "10"},  # Spark's default; delta-rs would assume 100
        )

    def check_schema(self):
        """The change from the table's columns to the sink file's (a falsy
        :class:`~reconcile.storage.schema_change.SchemaPlan` when they are the same) when a run
        applies it (a nullable column added: :mod:`.schema_change`). Refuses a table whose schema
        was changed behind the sink's back (:class:`ShardSchemaChanged`) and a sink file's change
        no run applies (:class:`SinkSchemaChange`, naming each change)."""
        schema = self.snapshot().schema().to_json()
        sink_cols, own = schema_change.table_columns(schema)
        have = sink_cols + own
        want = [(n.lower(), t) for n, t in self._columns()]
        legacy = [(n.lower(), t) for n, t in self._columns(keyed=False)]  # created before the row key was stored
        key = schema_change.recorded_key(schema)
        same_key = key is None or set(key) == {k.lower() for k in getattr(self.cfg, "key_columns", ())}
        if have in (want, legacy) and same_key:
            return schema_change.SchemaPlan()
        own_want = [c for c in want if c[0] in schema_change.SHARD_COLUMNS]
        own_legacy = [c for c in legacy if c[0] in schema_change.SHARD_COLUMNS]
        if own not in (own_want, own_legacy) or schema_change.who_changed(self, schema) == "foreign":
            raise ShardSchemaChanged(
                f"Delta table {self.path} has columns {have}, the sink expects {want}", sink=self.name
            )
        plan = schema_change.plan(self.cfg, sink_cols, key=key)
        if not plan.supported:
            what = "upsert key" if any(c.key for c in plan.changes) else "columns"
            raise SinkSchemaChange(
                f"the sink file {self.cfg.path or '(no file)'} changes the shard's {what}, which no run "
                f"applies: {plan.refusal()}.",
                sink=self.name,
            )
        return plan

    def schema_plan(self):
        """What the next run does with the sink file's schema against the table's
        (:func:`.schema_change.plan`), with the shard's update rows; never raises for a change
        (``validate``): a change behind the sink's back is a plan with the note ``foreign``."""
        from deltalake import DeltaTable

        # the schema alone first (no file list: validate reads every sink's log)
        schema = DeltaTable(self.path, storage_options=self.storage_options, without_files=True).schema().to_json()
        sink_cols, _ = schema_change.table_columns(schema)
        plan = schema_change.plan(self.cfg, sink_cols, key=schema_change.recorded_key(schema))
        if not plan:
            return plan
        dt = self.snapshot()
        schema = dt.schema().to_json()
        counts = dt.get_add_actions(flatten=True).column("num_records").to_pylist()
        rows = None if any(c is None for c in counts) else int(sum(counts))
        key = schema_change.recorded_key(schema)
        plan = schema_change.plan(self.cfg, schema_change.table_columns(schema)[0], rows, key)
        if plan and schema_change.who_changed(self, schema) == "foreign":
            return schema_change.SchemaPlan(plan.changes, rows, (*plan.notes, "foreign"))
        return plan

    def as_stored(self) -> ShardTable:
        """This shard under the columns its table has, while the sink file's schema change waits
        for the run that applies it (a copy whose config's columns are the table's: what its
        batches hashed, for ``check --deep`` to recompute); itself when they are the file's."""
        import copy

        from reconcile.config import Column

        fields = json.loads(self.snapshot().schema().to_json())["fields"]
        cols = [f for f in fields if f["name"].lower() not in schema_change.SHARD_COLUMNS]
        want = [(c.name.lower(), delta_type(c.type)) for c in self.cfg.columns]
        if [(f["name"].lower(), f["type"]) for f in cols] == want:
            return self
        nullable = {c.name.lower(): c.nullable for c in self.cfg.columns}
        columns = tuple(
            Column(f["name"], schema_change.spark_type(f["type"]), nullable.get(f["name"].lower(), True)) for f in cols
        )
        out = copy.copy(self)
        out.cfg = self.cfg.model_copy(update={"columns": columns})
        return out

    def records_no_key(self) -> bool:
        """Whether this upsert shard's schema records no key (:data:`.schema_change.KEY_META`: a
        shard created before the key was recorded). The next batch's commit records the sink
        file's ``upsert.key`` (:meth:`schema_for_commit`), so that a later change of it is refused."""
        keys = getattr(self.cfg, "key_columns", ())
        return bool(keys) and schema_change.recorded_key(self.snapshot().schema().to_json()) is None

    def schema_for_commit(self):
        """The sink's Delta schema (delta-rs), for the batch that commits a schema change (or
        records an upsert shard's key: :meth:`records_no_key`)."""
        from deltalake import Schema

        return Schema.from_json(self._schema_json())

    # -- the metadata-only commits -------------------------------------------------------------

    def commit_files(
        self,
        staged: list[tuple[str, int, dict]],
        meta: dict,
        lower: int,
        fence: Callable[[], None] | None = None,
        schema: Any = None,
        rewrite_of: int | None = None,
    ) -> int | None:
        """Commit ``staged`` (``(path relative to the table, size, stats)``) as one Delta version
        whose commit metadata is ``meta`` and whose application transaction is ``lower``: only if
        the snapshot's last recorded transaction is below ``lower``, at exactly the version after
        that snapshot (put-if-absent; a concurrent commit makes this re-check on the newer
        snapshot).

        ``fence`` (the writer's commit lease, :meth:`reconcile.storage.lease.CommitLease.fence`)
        is called right before each put of the commit file; whatever it raises (the lease was
        lost) ends the commit with nothing committed.

        ``schema`` (a delta-rs schema): the table's new schema, committed in the same version (a
        sink file's schema change, :mod:`.schema_change`). ``rewrite_of``: ``staged`` holds the
        shard rewritten into that schema from Delta version ``rewrite_of``
        (:mod:`reconcile.sink.evolve`): the commit also removes every file of that version, and
        is made as the version right after it or not at all (a table that moved since refuses
        the batch: :class:`StagedBatchInvalid`, its write stages it again).

        Returns the new version, or None when the guard skipped the commit (a version at or
        above ``lower`` is recorded: someone committed this lower, or a later one)."""
        for attempt in range(20):
            dt = self.snapshot()
            recorded = dt.transaction_version(self.app_id)
            if recorded is not None and recorded >= lower:
                return None
            if rewrite_of is not None and dt.version() != rewrite_of:
                raise StagedBatchInvalid(
                    f"the batch with lower {iso(lower)} rewrites the shard into the sink file's schema as of Delta "
                    f"version {rewrite_of}, and the table is at version {dt.version()} now",
                    sink=self.name,
                    remedy="rerun its write: it stages the batch again against the table as it is.",
                )
            if fence is not None:
                fence()
            mode = "append" if rewrite_of is None else "overwrite"  # an overwrite removes every file of dt
            version = self._commit_at_next(dt, mode, staged, {"op": "batch", **meta}, lower, "append", schema)
            if version is not None:
                return version
            time.sleep(min(0.05 * (attempt + 1), 0.5))  # another version took it: check the newer snapshot
        raise Retryable(
            f"Delta commit of the batch with lower {iso(lower)} kept losing to concurrent commits",
            sink=self.name,
            remedy="the task retries by itself; nothing was committed.",
        )

    def commit_rewrite(
        self,
        written: list[tuple[str, int, dict]],
        meta: dict,
        read_version: int,
        txn_version: int,
        fence: Callable[[], None] | None = None,
        schema: Any = None,
    ) -> tuple[int, int] | None:
        """Replace every data file of the snapshot at ``read_version`` with ``written`` (``(path
        relative to the table, size, stats)``) in one Delta version, ``read_version + 1`` and no
        other (put-if-absent, no retry), with the commit metadata ``meta`` and the application
        transaction ``txn_version``; ``fence`` as for :meth:`commit_files`; ``schema`` (delta-rs):
        the table's new schema in the same version (a rewrite into a sink file's schema). Returns (that
        version, how many files it removed), or None if any commit took it first."""
        dt = self.snapshot(read_version)
        removed = dt.get_add_actions(flatten=True).num_rows
        if fence is not None:
            fence()
        version = self._commit_at_next(dt, "overwrite", written, meta, txn_version, "compact", schema)
        return None if version is None else (version, removed)

    def _commit_at_next(
        self, dt, mode: str, files: list[tuple[str, int, dict]], meta: dict, txn: int, task: str, schema: Any = None
    ):
        """The one Delta commit the sink makes to its shard (:func:`commit_next`)."""
        self._pinned = None  # delta-rs may move ``dt`` to the version it commits
        return commit_next(dt, self.path, self.name, self.app_id, mode, files, meta, txn, task, schema=schema)

    # -- compactions' files and vacuum ----------------------------------------------------------

    def compaction_path(self, name: str | None = None) -> str:
        """The compactions' directory, or one compaction's (:func:`.layout.compaction_dir`)."""
        root = f"{self.path}/{COMPACTIONS_DIR}"
        return f"{root}/{name}" if name else root

    def compaction_dirs(self) -> list[str]:
        """The names of the compactions' directories."""
        return files.list_dirs(self.compaction_path())

    def vacuum_removed(self, retention_hours: int) -> list[str]:
        """Delete the files the log removed more than ``retention_hours`` ago (delta-rs's
        ``lite`` vacuum lists them from the tombstones, as a dry run) and commit nothing: unlike
        delta-rs's own vacuum, no ``VACUUM START``/``END`` is written to the log, so the only
        commits the sink makes are its guarded ones. Returns the deleted paths, relative to the
        table."""
        listed = self.snapshot().vacuum(
            retention_hours=retention_hours, enforce_retention_duration=False, dry_run=True, full=False
        )
        deleted = sorted(unquote(p) for p in listed)
        files.delete_files([f"{self.path}/{p}" for p in deleted])
        return deleted

    def unreferenced_files(self, retention_hours: int) -> tuple[int, list[str]]:
        """(version ``s`` of the latest snapshot, what delta-rs's ``full`` vacuum of it would
        delete, listed and not deleted): every file under the table that the snapshot at ``s``
        does not name, last modified (or removed by the log) more than ``retention_hours`` ago,
        except under a top-level directory whose name begins with ``_`` or ``.`` (the log), and
        except deletion vector files. Paths relative to the table."""
        dt = self.snapshot()
        found = dt.vacuum(retention_hours=retention_hours, enforce_retention_duration=False, dry_run=True, full=True)
        # delta-rs lists deletion vector files as unnamed even while the snapshot reads them
        # (a foreign DELETE on a table with the feature): the sink never deletes one
        paths = (unquote(p) for p in found)
        return dt.version(), sorted(p for p in paths if not p.rsplit("/", 1)[-1].startswith("deletion_vector_"))


def log_versions(log_path: str) -> list[int]:
    """The versions whose commit files are in a Delta log, ascending (one listing; a commit file
    appears atomically, so the highest name is the latest version)."""
    names = files.list_names(log_path)
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def commit_next(
    dt,
    path: str,
    sink: str,
    app_id: str,
    mode: str,
    files: list[tuple[str, int, dict]],
    meta: dict,
    txn: int,
    task: str,
    removed: tuple[tuple[str, int], ...] | list[tuple[str, int]] = (),
    schema: Any = None,
) -> int | None:
    """The one way the sink commits to a Delta table (delta-rs): ``files`` added (``overwrite``:
    and every file of ``dt`` removed; ``removed``, ``(path, size)`` relative to the table: those
    files removed) as the version right after ``dt``'s, with ``meta`` as the sink's commit
    metadata and ``(app_id, txn)`` as its application transaction. Returns the new version, or
    None when that version's commit file exists (put-if-absent lost). ``task``: the stage
    committing, named in a refusal. ``schema``: the table's new schema, in the same version."""
    from deltalake import CommitProperties, Transaction
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, RemoveAction

    now_ms = int(time.time() * 1000)
    actions: list = [
        AddAction(
            path=p,
            size=size,
            partition_values={},
            modification_time=now_ms,
            data_change=True,
            stats=json.dumps(stats, separators=(",", ":")),
        )
        for p, size, stats in files
    ]
    actions += [
        RemoveAction(path=p, data_change=True, deletion_timestamp=now_ms, size=size, partition_values={})
        for p, size in removed
    ]
    user_meta = json.dumps({META_KEY: {"sink": sink, **meta}}, sort_keys=True)
    read = dt.version()
    props = CommitProperties(
        custom_metadata={"userMetadata": user_meta},
        max_commit_retries=0,
        app_transactions=[Transaction(app_id=app_id, version=txn, last_updated=now_ms)],
    )
    if schema is not None and mode == "append":  # delta-rs sets a schema only with an overwrite
        return _commit_with_schema(dt, path, files, user_meta, app_id, txn, schema, now_ms)
    try:
        dt.create_write_transaction(
            actions, mode=mode, schema=dt.schema() if schema is None else schema, commit_properties=props
        )
    except CommitFailedError:  # version read + 1 is taken
        return None
    except Exception as exc:  # noqa: BLE001 - the table's protocol or storage refuses the writer
        raise CommitRejected(
            f"the Delta table at {path} refused the {task} commit: {brief(exc, 300)}",
            sink=sink,
            remedy="check the table's protocol/features (`DESCRIBE DETAIL`) and the warehouse's "
            f"permissions; nothing was committed, clear '{task}' once fixed.",
        ) from None
    return read + 1


def _commit_with_schema(
    dt, path: str, added: list[tuple[str, int, dict]], user_meta: str, app_id: str, txn: int, schema, now_ms: int
) -> int | None:
    """An append of ``added`` that also sets the table's schema to ``schema`` (a sink file's schema
    change, :mod:`.schema_change`), as the version right after ``dt``'s, put-if-absent (None: that
    version is taken). delta-rs's Python API commits a new schema only with an overwrite (which
    removes every file), so this one commit file is written by the sink, as the current-state
    table's are: ``commitInfo``, the application transaction, the table's ``metaData`` with the new
    schema (everything else as the snapshot has it), the ``add`` actions. A checkpoint every
    ``delta.checkpointInterval`` versions, as delta-rs's post-commit hook makes."""
    version = dt.version() + 1
    m = dt.metadata()
    metadata = {
        "id": m.id,
        "name": m.name,
        "description": m.description,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema.to_json(),
        "partitionColumns": list(m.partition_columns),
        "createdTime": m.created_time,
        "configuration": dict(m.configuration),
    }
    actions: list[dict] = [
        {
            "commitInfo": {
                "timestamp": now_ms,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append", "partitionBy": "[]"},
                "userMetadata": user_meta,
                "engineInfo": "reconcile",
                "isBlindAppend": False,
            }
        },
        {"txn": {"appId": app_id, "version": txn, "lastUpdated": now_ms}},
        {"metaData": metadata},
    ]
    for p, size, stats in added:  # the path as delta-rs's AddAction writes it (its removes match it)
        add = {"path": p, "partitionValues": {}, "size": size, "modificationTime": now_ms, "dataChange": True}
        actions.append({"add": {**add, "stats": json.dumps(stats, separators=(",", ":"))}})
    text = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
    if not files.put_if_absent(f"{path}/_delta_log/{version:020d}.json", text):
        return None
    if version % int(m.configuration.get("delta.checkpointInterval", "10")) == 0:
        try:
            dt.update_incremental()
            dt.create_checkpoint()
        except Exception:  # noqa: BLE001,S110 - a checkpoint only speeds reads up; the next one comes
            pass
    return version


def _data_files(dt) -> list[str]:
    """The data files a delta-rs snapshot names, relative to the table, decoded."""
    return [unquote(a) for a in dt.get_add_actions(flatten=True).column("path").to_pylist()]
