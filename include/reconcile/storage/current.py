"""A sink's current-state table, without a JVM: a plain Delta table of the sink's columns (no
``_time``, ``_diff``, ``_error``) holding the shard's collection as of its latest version, one row
per unit of count. Its files are written with pyarrow and committed by delta-rs the one way the
sink commits: put-if-absent of the version after the snapshot read, under the shard's commit
lease. Each commit records, as its application transaction ``(reconcile-current:<sink>, v)``, the
shard's Delta version ``v`` it reflects, and its freshness (:data:`PROPERTIES`) as table
properties and as the domain metadata of :data:`DOMAIN` (what DuckDB's ``delta_domain_metadata``
reads).

Its layout is what its data needs and no more (:meth:`CurrentTable.layout`): the schema's columns
with NOT NULL where the sink file says ``nullable: false`` and on an upsert sink's key (rows with
a null there are error rows, kept in the shard only); in its protocol, deletion vectors only where
``current.deletion_vectors`` is on, ``invariants`` (Delta's enforcement of NOT NULL) where a
column is NOT NULL, and ``domainMetadata`` for the freshness record. A table whose layout differs
from its sink file's (made before, or the sink file changed) is rebuilt in the new layout by the
next append. :mod:`reconcile.sink.current` decides what to write.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

from reconcile import settings
from reconcile.config import SinkConfig
from reconcile.errors import Retryable, SinkError, brief
from reconcile.storage import files, footers
from reconcile.storage.commits import META_KEY, describe_commit, info_of, parse_actions, reconcile_meta
from reconcile.storage.deletion_vectors import file_name
from reconcile.storage.delta import delta_type, log_versions

CURRENT_OP = "current"
ROWS_PER_FILE = 1_000_000
DV_FEATURE = "deletionVectors"
DOMAIN_FEATURE = "domainMetadata"
CHECKPOINT_INTERVAL = 10
# The freshness a commit records: the shard version the table reflects, and the upper of the
# shard's last batch in it (epoch ms, exclusive: the table holds the rows as of upper - 1), also
# as UTC text. Table properties of these names, and the same keys in the domain metadata of DOMAIN.
DOMAIN = "reconcile"
PROPERTIES = ("reconcile.shardVersion", "reconcile.upper", "reconcile.upperUtc")


def current_path(cfg: SinkConfig, warehouse: str | None = None) -> str:
    """Where the sink's current-state table lives: its ``current.path``, else beside the shard
    (``<warehouse>/<sink>.current``: no sink name has a dot, so no shard is ever there)."""
    if cfg.current is not None and cfg.current.path:
        return cfg.current.path
    return f"{warehouse or settings.warehouse()}/{cfg.name}.current"


class CurrentTable:
    """The current-state Delta table of one sink (``cfg.current`` set)."""

    def __init__(self, cfg: SinkConfig, warehouse: str | None = None):
        self.cfg = cfg
        self.name = cfg.name
        self.path = current_path(cfg, warehouse)
        self.log_path = f"{self.path}/_delta_log"
        self.app_id = f"reconcile-current:{cfg.name}"
        self.storage_options = settings.delta_storage_options()

    def __repr__(self) -> str:
        return f"CurrentTable({self.path!r})"

    def not_null(self) -> list[str]:
        """The columns the table declares NOT NULL: ``nullable: false`` in the sink file, and an
        upsert sink's key (a row with a null there is an error row: never in this table)."""
        keys = set(getattr(self.cfg, "key_columns", None) or ())
        return [c.name for c in self.cfg.columns if not c.nullable or c.name in keys]

    def fields(self) -> list[dict]:
        strict = set(self.not_null())
        return [
            {"name": c.name, "type": delta_type(c.type), "nullable": c.name not in strict, "metadata": {}}
            for c in self.cfg.columns
        ]

    def schema_json(self) -> str:
        return json.dumps({"type": "struct", "fields": self.fields()})

    def protocol(self) -> dict:
        """The protocol the table's data needs and no more (a reader refuses a table with a
        feature it does not know): deletion vectors (reader version 3) where it marks rows with
        them, the ``invariants`` writer feature where a column is NOT NULL (Delta enforces those
        as invariants), and ``domainMetadata`` for its freshness record."""
        writer = sorted([DOMAIN_FEATURE] + (["invariants"] if self.not_null() else []))
        if self.wants_vectors():
            return {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": [DV_FEATURE],
                "writerFeatures": sorted([DV_FEATURE, *writer]),
            }
        return {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": writer}

    def configuration(self) -> dict[str, str]:
        """The table properties of its layout (the freshness ones aside)."""
        conf = {"delta.checkpointInterval": str(CHECKPOINT_INTERVAL)}
        return {**conf, "delta.enableDeletionVectors": "true"} if self.wants_vectors() else conf

    def layout(self) -> dict:
        """What the sink file asks the table to be: protocol, columns, table properties."""
        return {
            "protocol": _plain_protocol(self.protocol()),
            "fields": self.fields(),
            "configuration": self.configuration(),
        }

    def layout_of(self, dt) -> dict:
        """The layout of the snapshot ``dt`` (as :meth:`layout` says it)."""
        p = dt.protocol()
        protocol = {
            "minReaderVersion": p.min_reader_version,
            "minWriterVersion": p.min_writer_version,
            "readerFeatures": p.reader_features,
            "writerFeatures": p.writer_features,
        }
        config = {k: v for k, v in dt.metadata().configuration.items() if k not in PROPERTIES}
        fields = json.loads(dt.schema().to_json())["fields"]
        return {"protocol": _plain_protocol(protocol), "fields": fields, "configuration": config}

    def layout_differences(self, dt) -> list[str]:
        """How the snapshot's layout differs from the sink file's, one phrase each (empty: not)."""
        have, want = self.layout_of(dt), self.layout()
        out = []
        vectors = DV_FEATURE in (have["protocol"].get("readerFeatures") or [])
        if vectors != self.wants_vectors():
            on = {True: "on", False: "off"}
            out.append(f"deletion vectors {on[vectors]}, the sink file says {on[self.wants_vectors()]}")
        elif have["protocol"] != want["protocol"]:
            out.append(f"protocol {_protocol_text(have['protocol'])}, wanted {_protocol_text(want['protocol'])}")
        by_name = {f["name"]: f for f in have["fields"]}
        if [f["name"] for f in have["fields"]] != [f["name"] for f in want["fields"]] or any(
            by_name[f["name"]]["type"] != f["type"] for f in want["fields"]
        ):
            out.append("columns differ from the sink's schema")
        else:
            loose = [f["name"] for f in want["fields"] if not f["nullable"] and by_name[f["name"]]["nullable"]]
            strict = [f["name"] for f in want["fields"] if f["nullable"] and not by_name[f["name"]]["nullable"]]
            if loose:
                out.append(f"{', '.join(loose)} nullable, the sink file says NOT NULL")
            if strict:
                out.append(f"{', '.join(strict)} NOT NULL, the sink file says nullable")
        if have["configuration"] != want["configuration"] and not out:
            out.append(f"table properties {have['configuration']}, wanted {want['configuration']}")
        return out

    def arrow_schema(self):
        import pyarrow as pa
        from deltalake import Schema

        return pa.schema(Schema.from_json(self.schema_json()).to_arrow())

    def exists(self) -> bool:
        return bool(log_versions(self.log_path))

    def snapshot(self):
        from deltalake import DeltaTable

        return DeltaTable(self.path, storage_options=self.storage_options)

    def create(self) -> None:
        """The empty table: a metadata-only version 0 in its layout, put-if-absent (a concurrent
        creator's loses, and then finds the table)."""
        now = now_ms()
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "engineInfo": "reconcile"}},
            {"protocol": self.protocol()},
            {"metaData": self._metadata(None, now, {})},
        ]
        try:
            if settings.store_of(self.log_path) is None:
                os.makedirs(self.log_path.removeprefix("file://"), exist_ok=True)
            files.put_if_absent(f"{self.log_path}/{0:020d}.json", _lines(actions))
        except Exception as exc:  # noqa: BLE001 - storage refused
            if not self.exists():
                raise Retryable(
                    f"cannot create the current-state table at {self.path}: {brief(exc, 300)}",
                    sink=self.name,
                    remedy="the task retries by itself; if it persists, check the path's permissions.",
                ) from None

    def _metadata(self, dt, now: int, freshness: dict[str, str]) -> dict:
        """The table's ``metaData`` action: its layout (the sink file's), its freshness; the
        snapshot's id and creation time when there is one."""
        old = dt.metadata() if dt is not None else None
        return {
            "id": old.id if old is not None else str(uuid.uuid4()),
            "name": self.name,
            "description": f"current state of sink {self.name} (maintained by the sink; do not write)",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": self.schema_json(),
            "partitionColumns": [],
            "configuration": {**self.configuration(), **freshness},
            "createdTime": (old.created_time if old is not None else None) or now,
        }

    def freshness(self, dt) -> dict[str, str]:
        """The snapshot's freshness properties (:data:`PROPERTIES`; empty before its first
        maintenance)."""
        conf = dt.metadata().configuration
        return {k: conf[k] for k in PROPERTIES if k in conf}

    def wants_vectors(self) -> bool:
        """Is the table to be created with deletion vectors (``current.deletion_vectors``, and a
        store where the sink commits them: a local disk or S3)?"""
        spec = self.cfg.current
        return bool(spec is not None and spec.deletion_vectors) and settings.store_of(self.path) in (None, "s3")

    def has_vectors(self, dt) -> bool:
        """Does the table's protocol have deletion vectors (retractions mark rows, not rewrite)?"""
        return DV_FEATURE in (dt.protocol().reader_features or [])

    def own_meta(self, dt) -> dict:
        """The sink's metadata of the snapshot's own version (empty when another writer made it)."""
        text = files.read_text(f"{self.log_path}/{dt.version():020d}.json")
        return (reconcile_meta(info_of(parse_actions(text))) or {}) if text else {}

    def vectors(self, dt) -> dict[str, dict]:
        """The deletion vector descriptor of each data file that has one (path relative to the
        table), as the sink's last commit recorded it (every commit records them all)."""
        return dict(self.own_meta(dt).get("vectors") or {})

    def reflected(self, dt) -> int | None:
        """The shard version the snapshot ``dt`` reflects (its last application transaction)."""
        return dt.transaction_version(self.app_id)

    def foreign_versions(self, dt) -> list[int]:
        """The versions of ``dt``'s log after the sink's last commit to it that another writer
        made and that changed data (they are undone by the next maintenance: a rebuild)."""
        versions = log_versions(self.log_path)
        foreign: list[int] = []
        for v in reversed([v for v in versions if v <= dt.version()]):
            text = files.read_text(f"{self.log_path}/{v:020d}.json")
            if text is None:
                break
            actions = parse_actions(text)
            if (reconcile_meta(info_of(actions)) or {}).get("op") == CURRENT_OP:
                break
            if describe_commit(actions) is None:
                foreign.append(v)
        return sorted(foreign)

    def data_files(self, dt) -> list[tuple[str, int]]:
        """(path relative to the table, size) of every file of the snapshot."""
        return [(p, size) for p, size, _ in self.files_and_rows(dt)]

    def files_and_rows(self, dt) -> list[tuple[str, int, int]]:
        """(path relative to the table, size, rows stored in it) of every file of the snapshot."""
        from urllib.parse import unquote

        import pyarrow as pa

        adds = pa.table(dt.get_add_actions(flatten=True))
        paths = [unquote(p) for p in adds.column("path").to_pylist()]
        rows = [int(n or 0) for n in adds.column("num_records").to_pylist()]
        return list(zip(paths, adds.column("size_bytes").to_pylist(), rows, strict=True))

    def write_rows(self, table) -> list[tuple[str, int, dict]]:
        """Write ``table`` (the sink's columns) as new Parquet files of at most
        :data:`ROWS_PER_FILE` rows; returns (path relative to the table, size, Delta stats)."""
        import pyarrow.parquet as pq

        table = table.select(self.cfg.column_names)
        nulls = [c for c in self.not_null() if table.column(c).null_count]
        if nulls:  # rows the shard stored before the sink file declared the column NOT NULL
            raise SinkError(
                f"the current-state table at {self.path} declares {', '.join(nulls)} NOT NULL (`nullable: false` "
                f"or the upsert key in the sink file) and the shard holds rows with a null there",
                sink=self.name,
                remedy="declare the column nullable in the sink file (the next append applies it), or correct those "
                "rows at the source; the shard is committed, only its current-state table waits.",
            )
        table = table.cast(self.arrow_schema())
        fs, root = files.fs_of(self.path)
        out = []
        for start in range(0, table.num_rows, ROWS_PER_FILE):
            rel = f"part-{uuid.uuid4().hex}.snappy.parquet"
            with fs.open(f"{root}/{rel}", "wb") as f:
                pq.write_table(table.slice(start, ROWS_PER_FILE), f, compression="snappy")
            full = f"{self.path}/{rel}"
            out.append((rel, fs.size(f"{root}/{rel}"), footers.file_stats(full)))
        return out

    def commit(
        self,
        dt,
        mode: str,
        added: list[tuple[str, int, dict]],
        removed: list[tuple[str, int]],
        meta: dict[str, Any],
        shard_version: int,
        upper: int | None = None,
    ) -> int | None:
        """One commit at the version after ``dt``'s (None: another commit took it): ``added`` new
        files; ``removed`` (path, size) gone (``overwrite``: every file of ``dt``)."""
        before = self.vectors(dt)
        if mode == "overwrite":
            gone = [(p, size, dv) for p, size, dv in self.live_files(dt)]
        else:
            gone = [(p, size, before.get(p)) for p, size in removed]
        operation = ("WRITE", {"mode": "Overwrite" if mode == "overwrite" else "Append"})
        return self._put(dt, operation, [(p, s, st, None) for p, s, st in added], gone, meta, shard_version, upper)

    def commit_vectors(
        self,
        dt,
        added: list[tuple[str, int, dict]],
        marked: dict[str, tuple[int, dict, dict]],
        removed: list[tuple[str, int]],
        before: dict[str, dict],
        vectors: dict[str, dict],
        meta: dict[str, Any],
        shard_version: int,
        upper: int | None = None,
    ) -> int | None:
        """One commit at the version after ``dt``'s that delta-rs cannot make: ``marked`` (path ->
        size, stats, new deletion vector descriptor) re-added with their new vectors, ``removed``
        gone, ``added`` new; ``vectors`` (every file's descriptor after it) recorded in the
        sink's metadata. Each file's old logical entry (path and old vector, ``before``: what
        :meth:`vectors` said of ``dt``) is removed, as the protocol keys a file by both."""
        gone = [(p, size, before.get(p)) for p, (size, _, _) in marked.items()]
        gone += [(p, size, before.get(p)) for p, size in removed]
        adds: list[tuple[str, int, dict, dict | None]] = [
            (p, size, {**stats, "tightBounds": False}, dv) for p, (size, stats, dv) in marked.items()
        ]
        adds += [(p, size, stats, None) for p, size, stats in added]
        operation = ("DELETE", {"predicate": '["retracted by the shard"]'})
        return self._put(dt, operation, adds, gone, {**meta, "vectors": vectors}, shard_version, upper)

    def live_files(self, dt) -> list[tuple[str, int, dict | None]]:
        """(path relative to the table, size, deletion vector descriptor or None) of every file
        of ``dt``: the sink's own record of its vectors, or, when another writer committed since
        (its vectors unknown to the sink), the log replayed: a checkpoint of ``dt``'s version,
        read back."""
        if not self.foreign_versions(dt):
            vectors = self.vectors(dt)
            return [(p, size, vectors.get(p)) for p, size in self.data_files(dt)]
        from urllib.parse import unquote

        import pyarrow.parquet as pq

        checkpoint = f"{self.log_path}/{dt.version():020d}.checkpoint.parquet"
        if not files.path_exists(checkpoint):
            dt.create_checkpoint()
        fs, p = files.fs_of(checkpoint)
        with fs.open(p, "rb") as f:
            adds = pq.read_table(f, columns=["add"]).column("add").to_pylist()
        return [(unquote(a["path"]), int(a["size"]), a.get("deletionVector")) for a in adds if a]

    def _put(
        self,
        dt,
        operation: tuple[str, dict],
        adds: list[tuple[str, int, dict, dict | None]],
        removes: list[tuple[str, int, dict | None]],
        meta: dict[str, Any],
        shard_version: int,
        upper: int | None,
    ) -> int | None:
        """Write the version after ``dt``'s, put-if-absent (None: another commit took it): the
        files ``removes`` (path, size, their deletion vector) gone and ``adds`` (path, size,
        stats, deletion vector) new, the application transaction of ``shard_version``, the
        table's metadata with its freshness (``upper`` None: the snapshot's), and its protocol
        when the snapshot's is not the sink file's. A checkpoint every
        :data:`CHECKPOINT_INTERVAL` versions, as delta-rs."""
        now = now_ms()
        version = dt.version() + 1
        if upper is None and self.freshness(dt).get("reconcile.upper"):
            upper = int(self.freshness(dt)["reconcile.upper"])
        fresh = freshness_properties(shard_version, upper)
        user = {META_KEY: {"sink": self.name, "op": CURRENT_OP, "shard_version": shard_version, "upper": upper, **meta}}
        name, params = operation
        actions: list[dict] = [
            {
                "commitInfo": {
                    "timestamp": now,
                    "operation": name,
                    "operationParameters": params,
                    "userMetadata": json.dumps(user, sort_keys=True),
                    "engineInfo": "reconcile",
                    "isBlindAppend": name == "WRITE" and not removes and params.get("mode") == "Append",
                }
            },
            {"txn": {"appId": self.app_id, "version": shard_version, "lastUpdated": now}},
        ]
        if self.layout_of(dt)["protocol"] != _plain_protocol(self.protocol()):
            actions.append({"protocol": self.protocol()})
        actions.append({"metaData": self._metadata(dt, now, fresh)})
        record = {"shardVersion": shard_version, "upper": upper, "upperUtc": fresh.get("reconcile.upperUtc")}
        actions.append({"domainMetadata": {"domain": DOMAIN, "configuration": json.dumps(record), "removed": False}})
        actions += [{"remove": _remove(p, size, now, dv)} for p, size, dv in removes]
        actions += [{"add": _add(p, size, stats, now, dv)} for p, size, stats, dv in adds]
        if not files.put_if_absent(f"{self.log_path}/{version:020d}.json", _lines(actions)):
            return None
        if version % CHECKPOINT_INTERVAL == 0:
            try:
                self.snapshot().create_checkpoint()
            except Exception as exc:  # noqa: BLE001 - a checkpoint only speeds reads up; the next one comes
                import logging

                logging.getLogger(__name__).warning("no checkpoint at version %s of %s: %s", version, self.path, exc)
        return version

    def vacuum(self, retention_hours: int) -> list[str]:
        """Delete the files the latest snapshot does not name (removed by the log, or written by
        an attempt that died before its commit) last changed more than ``retention_hours`` ago;
        nothing is committed. Returns them, relative to the table."""
        from urllib.parse import unquote

        if not self.exists():
            return []
        dt = self.snapshot()
        listed = dt.vacuum(retention_hours=retention_hours, enforce_retention_duration=False, dry_run=True, full=True)
        # delta-rs's vacuum counts no deletion vector file as named: keep the ones the snapshot
        # reads (every one while another writer's commit may name some)
        keep = {file_name(d) for d in self.vectors(dt).values()}
        foreign = bool(self.foreign_versions(dt))
        deleted = sorted(
            p
            for p in (unquote(x) for x in listed)
            if not (p.startswith("deletion_vector_") or "/deletion_vector_" in p) or (p not in keep and not foreign)
        )
        files.delete_files([f"{self.path}/{p}" for p in deleted])
        return deleted


def read_parquet(paths: list[str], columns: list[str] | None = None, *, positions: bool = False):
    """The rows of Parquet files (local or on an object store), concatenated, with ``_file``: the
    index of each row's file in ``paths`` (``positions``: and ``_pos``, the row's position in its
    file, as deletion vectors count). Read in parallel (a round trip each on a store)."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow as pa
    import pyarrow.parquet as pq

    def read(item: tuple[int, str]):
        i, path = item
        fs, p = files.fs_of(path)
        with fs.open(p, "rb") as f:
            t = pq.read_table(f, columns=columns)
        t = t.append_column("_file", pa.array([i] * t.num_rows, pa.int32()))
        return t.append_column("_pos", pa.array(range(t.num_rows), pa.int64())) if positions else t

    if not paths:
        return None
    with ThreadPoolExecutor(max_workers=min(8, len(paths))) as pool:
        tables = list(pool.map(read, enumerate(paths)))
    return pa.concat_tables(tables, promote_options="permissive")


def _add(path: str, size: int, stats: dict, now: int, dv: dict | None) -> dict:
    from urllib.parse import quote

    add = {"path": quote(path), "partitionValues": {}, "size": size, "modificationTime": now, "dataChange": True}
    add["stats"] = json.dumps(stats, separators=(",", ":"))
    return {**add, "deletionVector": dv} if dv else add


def _remove(path: str, size: int, now: int, dv: dict | None) -> dict:
    from urllib.parse import quote

    remove = {"path": quote(path), "dataChange": True, "deletionTimestamp": now, "extendedFileMetadata": True}
    remove.update(partitionValues={}, size=size)
    return {**remove, "deletionVector": dv} if dv else remove


def _lines(actions: list[dict]) -> bytes:
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()


def _plain_protocol(p: dict) -> dict:
    """A protocol as a comparable value (features sorted, absent lists dropped)."""
    out: dict = {"minReaderVersion": int(p["minReaderVersion"]), "minWriterVersion": int(p["minWriterVersion"])}
    for k in ("readerFeatures", "writerFeatures"):
        if p.get(k):
            out[k] = sorted(p[k])
    return out


def _protocol_text(p: dict) -> str:
    features = sorted(set(p.get("readerFeatures") or []) | set(p.get("writerFeatures") or []))
    return f"({p['minReaderVersion']}, {p['minWriterVersion']}{', ' + ' '.join(features) if features else ''})"


def freshness_properties(shard_version: int, upper: int | None) -> dict[str, str]:
    """The table properties a commit records (:data:`PROPERTIES`)."""
    from datetime import UTC, datetime

    out = {"reconcile.shardVersion": str(shard_version)}
    if upper is not None:
        at = datetime.fromtimestamp(upper / 1000, UTC)
        out["reconcile.upper"] = str(upper)
        out["reconcile.upperUtc"] = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
    return out


def now_ms() -> int:
    return int(time.time() * 1000)
