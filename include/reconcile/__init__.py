"""A self-correcting batch sink: a Delta table kept equal to a desired collection, one guarded
batch per Airflow run (mint -> write -> append), its history an update log readable as of any time.

Layout (each layer imports only the ones above it; tests/test_layout.py checks it):

- ``model``, ``config``, ``errors``, ``settings``, ``log``, ``failpoints``: the vocabulary;
- ``differential``: update frames: consolidate, as_of, partitioning (pure DataFrame transforms);
- ``kinds``: what a sink desires (query, changelog, upsert) and its correction, behind one seam;
- ``storage``: the shard's Delta table, log and staged batches (``delta``) and the SQL ledger
  (``ledger``, ``tables``, ``migrations``); never imports the stages;
- ``sink``: the stages (``mint``, ``write``, ``append``, ``compact``, ``check``), which meet only
  through ``sync`` and ``model``; ``run.run_batch`` is the one mint -> write -> append;
- ``airflow``: DAG factory, tasks, UI; ``cli``: the operator's commands.
"""
