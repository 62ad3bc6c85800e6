"""The shard's storage: its Delta table, log and staged batches (``delta``); the SQL ledger (``ledger``: its
rows ``ledger_rows``, its database ``engine``, the commit lease ``lease``)."""
