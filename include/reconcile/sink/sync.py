"""Roll the ledger forward to the Delta log, and delete staged files that can never be appended.

Every stage syncs first: the Delta log is the linearization point and the source of truth; the
ledger follows it. For each batch commit found after the last version the ledger absorbed
(commit metadata ``{"reconcile": {"op": "batch", ...}}``), :meth:`MetadataStore.absorb_commit`
compare-and-sets ``upper`` from the batch's ``lower`` to its ``upper`` and marks the batch
committed. This repairs a crash between the Delta commit and the ledger update, whoever comes
next.
"""

from __future__ import annotations

import logging

from reconcile.config import SinkConfig
from reconcile.log import event
from reconcile.model import COMMITTED
from reconcile.storage import delta as storage
from reconcile.storage.ledger import MetadataStore
from reconcile.storage.tables import Shard

log = logging.getLogger("reconcile.sync")


def sync(store: MetadataStore, cfg: SinkConfig) -> Shard:
    """Roll the metadata forward to every batch commit in the Delta log it has not absorbed."""
    shard = store.get_shard(cfg.name)
    if not storage.exists(cfg):
        return shard
    latest, entries = storage.history_since(cfg, shard.delta_version)
    for rec in storage.batch_commits(entries):
        if store.absorb_commit(cfg.name, rec):
            event(log, "rolled metadata forward to a Delta batch commit", sink=cfg.name, **rec.summary())
    if entries:
        store.note_delta_version(cfg.name, latest)
    return store.get_shard(cfg.name)


def stale_staged(store: MetadataStore, cfg: SinkConfig) -> list[str]:
    """Staged directories that can never become part of the table (``<batch>`` or
    ``<batch>/<stage>``), as of the synced ledger.

    Staged files are table files once committed, and an append in flight commits the attempt
    the ledger named when it looked: so only a batch whose ``lower`` the shard's upper has
    passed loses files (no batch with that lower can ever be committed again: Delta's guard
    records a version at or above it), and of a committed batch only the attempts other than
    the committed one. A directory of a batch the ledger does not know is left alone."""
    shard = store.get_shard(cfg.name)
    known = {b.batch_id: b for b in store.batches(cfg.name)}
    out = []
    for batch_id in storage.list_dirs(storage.staging_root(cfg)):
        b = known.get(batch_id)
        if b is None or b.lower >= shard.upper:
            continue
        if b.state != COMMITTED:
            out.append(batch_id)
        elif b.stage_id:  # a committed batch without its attempt recorded keeps every directory
            out += [
                f"{batch_id}/{s}" for s in storage.list_dirs(storage.staging_path(cfg, batch_id)) if s != b.stage_id
            ]
    return out


def gc_staged(store: MetadataStore, cfg: SinkConfig) -> list[str]:
    """Delete staged files that can never be appended (seed 002, batch.delete())."""
    deleted = stale_staged(store, cfg)
    for rel in deleted:
        storage.delete_path(f"{storage.staging_root(cfg)}/{rel}")
    legacy = storage.legacy_staging_root(cfg)  # staged by releases before the metadata-only append
    if storage.path_exists(legacy):
        upper = store.get_shard(cfg.name).upper
        open_ids = {b.batch_id for b in store.batches(cfg.name) if b.lower >= upper}
        for batch_id in storage.list_dirs(legacy):
            if batch_id not in open_ids:
                storage.delete_path(f"{legacy}/{batch_id}")
                deleted.append(f"{legacy}/{batch_id}")
    if deleted:
        shard = store.get_shard(cfg.name)
        event(
            log,
            "deleted staged files that can never be appended",
            sink=cfg.name,
            dirs=",".join(deleted),
            upper=shard.upper,
        )
    return deleted
