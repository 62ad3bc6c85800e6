"""Airflow plugin of this deployment: the "Reconcile shards" pages.

The plugin itself is ``reconcile.airflow.plugin`` (installed with the package, also registered by
its ``airflow.plugins`` entry point); this file only makes it visible to an Airflow that reads
this plugins folder. Airflow registers a plugin once by name, however many times it is found.
"""

from reconcile.airflow.plugin import ReconcilePlugin

__all__ = ["ReconcilePlugin"]
