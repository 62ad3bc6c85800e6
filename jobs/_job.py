"""Shared entry point of the spark-submit jobs: parse args, run one stage, exit with a verdict."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable


def main(stage: str, fn: Callable[[str, str, str | None], str]) -> None:
    parser = argparse.ArgumentParser(description=f"reconcile sink: {stage} stage of one DAG run")
    parser.add_argument("--sink", required=True, help="sink name (its config file in RECONCILE_SINKS_DIR)")
    parser.add_argument("--run-id", required=True, help="the Airflow run id that minted the batch")
    parser.add_argument("--batch-id", default=None, help="the batch the run's mint minted (default: its newest)")
    args = parser.parse_args()
    batch_id = None if args.batch_id in (None, "", "None") else args.batch_id
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)

    from reconcile.errors import Retryable, SinkError

    try:
        message = fn(args.sink, args.run_id, batch_id)
    except SinkError as exc:
        kind = "RETRYABLE" if isinstance(exc, Retryable) else "FAILED"
        print(f"RECONCILE {stage} {kind}: {exc}", file=sys.stderr, flush=True)
        sys.exit(75 if isinstance(exc, Retryable) else 3)
    print(f"RECONCILE {stage} OK: {message}", flush=True)
