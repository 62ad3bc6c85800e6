"""One batch, end to end: ``mint -> write -> append`` (the only place the three meet).

The CLI's ``run``, the tests, the randomized schedules and the benchmarks all run batches through
:func:`run_batch`; the Airflow DAG runs the same three stages as three tasks, handing the minted
batch id forward (XCom), so the batch appended is always the batch minted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from reconcile.config import SinkConfig
from reconcile.sink.append import AppendResult, run_append
from reconcile.sink.mint import MintResult, run_mint
from reconcile.sink.write import WriteResult, run_write
from reconcile.storage.ledger import MetadataStore


@dataclass
class BatchRun:
    mint: MintResult
    write: WriteResult | None = None
    append: AppendResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage run

    @property
    def message(self) -> str:
        last = self.append or self.write or self.mint
        return last.message


def run_batch(
    spark: SparkSession,
    store: MetadataStore,
    cfg: SinkConfig,
    run_id: str,
    frontier: int,
    *,
    attempt: int = 1,
    read_only: bool = False,
    on_written: Callable[[WriteResult], None] | None = None,
) -> BatchRun:
    """Mint the run's batch (or re-use it), write it, append it. A description that is outdated
    by the time it is written ends the run there (nothing to append; the next run, or a rerun of
    this one, mints from the new upper). Errors propagate (:mod:`reconcile.errors`).
    ``on_written`` sees the write's result before the append starts."""
    t0 = time.perf_counter()
    m = run_mint(store, cfg, run_id, attempt, frontier, read_only=read_only)
    run = BatchRun(m, seconds={"mint": time.perf_counter() - t0})
    if m.description is None:
        return run
    t1 = time.perf_counter()
    run.write = run_write(spark, store, cfg, m.description.batch_id)
    run.seconds["write"] = time.perf_counter() - t1
    if on_written is not None:
        on_written(run.write)
    if run.write.outcome == "outdated":
        return run
    t2 = time.perf_counter()
    run.append = run_append(spark, store, cfg, m.description.batch_id)
    run.seconds["append"] = time.perf_counter() - t2
    return run
