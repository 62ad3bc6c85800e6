"""The shard's storage: its Delta table, log and staged batches (``delta``); the SQL ledger (``ledger``)."""
