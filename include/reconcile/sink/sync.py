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

from pyspark.sql import SparkSession

from reconcile.config import SinkConfig
from reconcile.log import event
from reconcile.model import OPEN_STATES
from reconcile.storage import delta as storage
from reconcile.storage.ledger import MetadataStore
from reconcile.storage.tables import Shard

log = logging.getLogger("reconcile.sync")


def sync(spark: SparkSession, store: MetadataStore, cfg: SinkConfig) -> Shard:
    """Roll the metadata forward to every batch commit in the Delta log it has not absorbed."""
    shard = store.get_shard(cfg.name)
    if not storage.exists(spark, cfg):
        return shard
    latest, entries = storage.history_since(spark, cfg, shard.delta_version)
    for rec in storage.batch_commits(entries):
        if store.absorb_commit(cfg.name, rec):
            event(log, "rolled metadata forward to a Delta batch commit", sink=cfg.name, **rec.summary())
    if entries:
        store.note_delta_version(cfg.name, latest)
    return store.get_shard(cfg.name)


def gc_staged(spark: SparkSession, store: MetadataStore, cfg: SinkConfig) -> list[str]:
    """Delete staged files of every batch that can never be appended (seed 002, batch.delete())."""
    shard = store.get_shard(cfg.name)
    keep = {b.batch_id for b in store.batches(cfg.name, OPEN_STATES) if b.lower >= shard.upper}
    deleted = []
    for batch_id in storage.list_dirs(spark, storage.staging_root(cfg)):
        if batch_id not in keep:
            storage.delete_path(spark, storage.staging_path(cfg, batch_id))
            deleted.append(batch_id)
    if deleted:
        event(log, "deleted outdated staged batches", sink=cfg.name, batches=",".join(deleted), upper=shard.upper)
    return deleted
