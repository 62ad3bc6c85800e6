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
from reconcile.storage.ledger import Ledger


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
    ledger: Ledger,
    cfg: SinkConfig,
    run_id: str,
    frontier: int,
    *,
    attempt: int = 1,
    read_only: bool = False,
    approve: str | None = None,
    on_minted: Callable[[MintResult], None] | None = None,
    on_written: Callable[[WriteResult], None] | None = None,
) -> BatchRun:
    """Mint the run's batch (or re-use it), write it, append it. Errors propagate
    (:mod:`reconcile.errors`); ``on_minted`` sees each mint's result before its write,
    ``on_written`` each write's result before its append;
    ``approve`` (who) lets the batch past the sink's correction guard.

    A description that is outdated by the time it is written (the ledger was behind the Delta
    log when mint read it: another writer, or a crash after a Delta commit that the write's sync
    just rolled forward) is minted again, by mint, from the new upper: the run goes on as a rerun
    of it would. In Airflow the run's remaining tasks are skipped instead and the next run
    appends the rest."""
    run: BatchRun | None = None
    for _ in range(MINTS):
        t0 = time.perf_counter()
        minted = run_mint(ledger, cfg, run_id, attempt, frontier, read_only=read_only)
        if run is None:
            run = BatchRun(minted)
        run.mint = minted
        run.seconds["mint"] = run.seconds.get("mint", 0.0) + time.perf_counter() - t0
        if on_minted is not None:
            on_minted(minted)
        desc = run.mint.description
        if desc is None:
            return run
        t1 = time.perf_counter()
        run.write = run_write(spark, ledger, cfg, desc.batch_id)
        run.seconds["write"] = run.seconds.get("write", 0.0) + time.perf_counter() - t1
        if on_written is not None:
            on_written(run.write)
        if run.write.outcome != "outdated":
            t2 = time.perf_counter()
            run.append = run_append(ledger, cfg, desc.batch_id, approve=approve)
            run.seconds["append"] = time.perf_counter() - t2
            return run
    assert run is not None
    return run


MINTS = 3  # a description outdated again and again means writers keep racing: leave it to the next run
