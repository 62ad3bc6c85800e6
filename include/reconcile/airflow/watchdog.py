"""What the sink knows, in the log of a task that was killed.

A task process killed outright (the kernel's OOM killer, ``kill -9``) runs no ``finally`` and
no callback: Airflow's log ends with "Process terminated by signal. Likely out of memory error
(OOM)" and nothing of the sink's. So each stage task starts a watchdog: a small process that
inherits the task's stdout and stderr (which Airflow's supervisor keeps reading for a while
after the task process ended, ``[workers] socket_cleanup_timeout``) and holds the read end of a
pipe whose write end only the task holds. The task says ``done`` on that pipe however it ends
(success or an exception); the watchdog then exits without a word. If the pipe closes without
``done``, the task died: the watchdog reads the ledger and the shard's staging area and writes
one line into the same log: the attempt, whether anything was staged or committed, and what
happens next.

    with watched(sink, run_id, "write", try_number):
        ...  # the stage

The watchdog is its own session (``start_new_session``): a kill of the task's process group
does not take it along. It costs the task one ``fork``/``exec`` of a small Python process
(no JVM, no import of the sink's modules until the task died).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

DONE = b"done\n"


@contextmanager
def watched(sink: str, run_id: str, stage: str, try_number: int | None) -> Iterator[None]:
    """Run the block with a watchdog that reports in the task's log if the process dies in it."""
    read, write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconcile.airflow.watchdog", str(read), sink, run_id, stage, str(try_number or 0)],
            pass_fds=(read,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=os.environ.copy(),
        )
    except OSError:  # no watchdog is no reason to fail the stage
        os.close(write)
        proc = None
    finally:
        os.close(read)
    try:
        yield
    finally:
        if proc is not None:
            try:
                os.write(write, DONE)
            except OSError:
                pass
            os.close(write)
            proc.wait(timeout=30)


def report(sink: str, run_id: str, stage: str, try_number: int) -> str:
    """The line a watchdog writes when its task died: what the ledger and the staging area hold
    for the run's batch now."""
    from reconcile.airflow.tasks import run_batch_of, sink_and_ledger
    from reconcile.log import iso
    from reconcile.model import COMMITTED
    from reconcile.storage.delta import ShardTable

    head = (
        f"reconcile: the {stage} task of sink {sink} (run {run_id}, try {try_number}) was killed before it finished "
        "(SIGKILL: the kernel's out-of-memory killer or kill -9; the sink's own errors never end a task this way)"
    )
    with sink_and_ledger(sink) as (cfg, ledger):
        b = run_batch_of(ledger, cfg.name, run_id, None)
        if b is None:
            return f"{head}: the run minted no batch; nothing was staged or committed."
        table = ShardTable(cfg)
        attempts = table.staged_attempts(b.batch_id)
        staged = (
            f"{len(attempts)} write attempt(s) staged under {table.staging_path(b.batch_id)}"
            if attempts
            else "nothing staged"
        )
        if b.state == COMMITTED:
            done = f"committed at Delta version {b.delta_version}: nothing is lost or applied twice"
        else:
            done = "nothing committed (a staged attempt is committed only by append, at most once)"
        after = {
            "write": "a retry or a clear of write stages the batch anew; files of the dead attempt are deleted by a later cleanup",
            "append": "a retry or a clear of append commits the staged batch if it is not committed yet",
            "compact": "the next compaction starts over; a rewrite that was not committed is deleted",
        }.get(stage, "a retry starts the stage over")
        return (
            f"{head}: batch {b.batch_id} [{iso(b.lower)}, {iso(b.upper)}) is {b.state}; {staged}; {done}. "
            f"Next: {after}; if memory ran out, give the task more (spark.driver.memory, the worker's limit)."
        )


def main(argv: list[str]) -> int:
    fd, sink, run_id, stage, try_number = int(argv[0]), argv[1], argv[2], argv[3], int(argv[4])
    got = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(64):
            got += chunk
    if DONE in got:
        return 0
    try:
        line = report(sink, run_id, stage, try_number)
    except Exception as exc:  # noqa: BLE001 - say what can be said
        line = (
            f"reconcile: the {stage} task of sink {sink} (run {run_id}, try {try_number}) was killed before it "
            f"finished; the ledger could not be read to say more ({type(exc).__name__}: {exc})"
        )
    print(line, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
