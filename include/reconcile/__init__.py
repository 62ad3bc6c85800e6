"""A self-correcting batch sink: a Delta table kept equal to a desired collection, one guarded
batch per Airflow run (mint -> write -> append), its history an update log readable as of any time.

Layout (each layer imports only the ones above it; tests/test_layout.py checks it):

- ``model``, ``config`` (a sink file's models; ``config_messages``: its problems as one line
  each; ``config_loading``: reading the files), ``errors``, ``settings``, ``log``, ``failpoints``:
  the vocabulary;
  ``schedule``: a run's times (epoch ms, desired frontier, the schedule's ticks);
- ``differential``: update frames: consolidate, as_of, partitioning (pure DataFrame transforms);
- ``kinds``: what a sink desires (query, changelog, upsert) and its correction, behind one seam;
- ``storage``: the shard's Delta table, log and staged batches (``delta``) and the SQL ledger
  (``ledger``, ``tables``, ``migrations``); never imports the stages;
- ``report``: what an operator reads (status, a shard as of a time, how times are written);
- ``sink``: the stages (``mint``, ``write``, ``append``, ``compact``, ``check``), which meet only
  through ``sync`` and ``model``; ``run.run_batch`` is the one mint -> write -> append;
- ``airflow``: DAG factory, tasks, UI; ``cli``: the operator's commands.
"""
