"""spark-submit job: stage the correction ``desired - persist`` of a DAG run's batch.

    spark-submit jobs/write_correction.py --sink <name> --run-id <airflow run id>

Reads the run's batch description from the ledger, computes the correction, stages it
as P hash partitions plus a manifest. A retried job replaces its own staged output.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _job import main  # noqa: E402

if __name__ == "__main__":
    from reconcile.airflow.tasks import stage_for_run

    main("write", stage_for_run)
