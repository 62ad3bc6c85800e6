"""spark-submit job: compaction of a sink's shard (advance since, consolidate, vacuum).

    spark-submit jobs/compact_shard.py --sink <name> --run-id <airflow run id>

Guarded against racing appends by the sink's Delta commit guard: a compaction that loses a
race changes nothing and exits as retryable. Safe to rerun at any time.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _job import main  # noqa: E402

if __name__ == "__main__":
    from reconcile.airflow.tasks import compact_for_run

    main("compact", compact_for_run)
