"""One attempt of each of a list of runs, as a separate process: ``python tests/racer.py SINK
ATTEMPT RUN_ID:FRONTIER...``.

Started several times at once with the same runs, these processes are a zombie task and its
retries (or a cron and a person starting the same command): every process mints, writes and
appends the *same* batch of each run. Each prints one line per run, ``RESULT <run> <stage>
<outcome or error class>: <message>``, so a test can check what the losers were told.
Environment: RECONCILE_SINKS_DIR, RECONCILE_WAREHOUSE, RECONCILE_METADATA_URL.
"""

from __future__ import annotations

import sys

from reconcile import settings
from reconcile.config_loading import load_sink
from reconcile.errors import SinkError
from reconcile.sink.run import run_batch
from reconcile.spark import get_session
from reconcile.storage.ledger import Ledger


def main(sink: str, attempt: int, runs: list[str]) -> int:
    cfg = load_sink(sink)
    ledger = Ledger(settings.metadata_url())
    spark = get_session(f"racer-{attempt}", {"spark.sql.shuffle.partitions": "2"})
    for spec in runs:
        run_id, frontier = spec.split(":")
        written = []
        try:
            r = run_batch(spark, ledger, cfg, run_id, int(frontier), attempt=attempt, on_written=written.append)
            if r.write is None:
                print(f"RESULT {run_id} mint nothing: {r.mint.message}", flush=True)
                continue
            print(f"RESULT {run_id} write {r.write.outcome}: {r.write.message}", flush=True)
            if r.append is not None:
                print(f"RESULT {run_id} append {r.append.outcome}: {r.append.message}", flush=True)
        except SinkError as exc:
            stage = "append" if written else "write"
            print(f"RESULT {run_id} {stage} {type(exc).__name__}: {exc}", flush=True)
    ledger.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
