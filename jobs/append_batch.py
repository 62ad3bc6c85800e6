"""spark-submit job: the guarded, transactional commit of a DAG run's staged batch.

    spark-submit jobs/append_batch.py --sink <name> --run-id <airflow run id>

Commits all staged partitions as one Delta version only if the shard's upper still equals the
batch's lower; repairs a crash between an earlier Delta commit and its metadata update; cleans
up outdated staged batches. Safe to rerun at any time.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _job import main  # noqa: E402

if __name__ == "__main__":
    from reconcile.airflow.tasks import commit_for_run

    main("append", commit_for_run)
