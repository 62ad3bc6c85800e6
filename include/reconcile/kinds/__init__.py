"""Sink kinds: what a sink desires and its correction against the shard (query, changelog, upsert)."""
