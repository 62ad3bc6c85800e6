"""Airflow plugin of this deployment: the "Reconcile shards" pages.

The plugin is ``reconcile.airflow.plugin``. Installed as a package (``pip install``, or the
editable install of scripts/setup.sh), its ``airflow.plugins`` entry point registers it and this
file adds nothing (Airflow would otherwise find it twice and warn on every command). Run from the
source tree without the package installed (the Docker image: ``include/`` on the PYTHONPATH),
this file is what makes Airflow see it.
"""

from importlib.metadata import entry_points

if not entry_points(group="airflow.plugins", name="reconcile"):
    from reconcile.airflow.plugin import ReconcilePlugin

    __all__ = ["ReconcilePlugin"]
