"""What the object-store tests (tests/test_s3_store.py on versitygw, tests/test_adls.py on
Azurite) assert of any store the warehouse may live on, once for all: an emulator as a fixture,
racing conditional puts, and delta-rs creating, appending and racing its commits.

Each assertion here takes the store's own client, URL and options, so a store is one fixture
plus one line per property.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pytest

from harness.emulator_server import Emulator, EmulatorMissing, SignedClient, running

E = TypeVar("E", bound=Emulator)


def serve(start: Callable[[Path], E], base: Path) -> Iterator[E]:
    """A fixture's emulator: started under ``base``, stopped after. Not installed: the test is
    skipped (failed under CI)."""
    try:
        server = start(base)
    except EmulatorMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    with running(server):
        yield server


def at_once(n: int, fn: Callable[[int], None]) -> None:
    """``fn(0)`` .. ``fn(n - 1)``, each in a thread of its own, let go together; returns when all
    have returned."""
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _body(writer: int) -> bytes:
    return f"writer {writer}".encode().ljust(2048, b".")


def race_conditional_puts(server: Emulator, key: str, writers: int) -> list[int]:
    """``writers`` puts of ``key`` with ``If-None-Match: *``, each on its own connection, all sent
    but their last byte before any is let go: the server handles them at the same moment.
    Returns each writer's HTTP status."""
    client = server.client()
    requests = [client.raw_put(key, _body(i), {"If-None-Match": "*"}) for i in range(writers)]
    socks = [socket.create_connection((server.host, server.port), timeout=60) for _ in range(writers)]
    try:
        for sock, req in zip(socks, requests):
            sock.sendall(req[:-1])
        time.sleep(0.02)
        for sock, req in zip(socks, requests):
            sock.sendall(req[-1:])
        return [int(sock.makefile("rb").readline().split()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def assert_put_if_absent_has_exactly_one_winner(server: Emulator, rounds: int, writers: int = 48) -> None:
    """Round after round, of ``writers`` racing conditional puts of a fresh key exactly one is
    stored (the rest refused with the store's status) and the key holds its bytes, whole; then an
    unconditional put still replaces the key (the refusals were about it existing)."""
    client = server.client()
    winners_per_round = []
    for round_ in range(rounds):
        key = f"race/{round_:04d}.json"
        statuses = race_conditional_puts(server, key, writers)
        assert set(statuses) <= {client.created, client.refused}, statuses
        winners = [i for i, status in enumerate(statuses) if status == client.created]
        winners_per_round.append(len(winners))
        if len(winners) == 1:
            assert client.get(key) == _body(winners[0])
    assert winners_per_round == [1] * rounds
    assert client.put("race/0000.json", b"replaced") == client.created
    assert client.get("race/0000.json") == b"replaced"


def assert_delta_rs_never_overwrites_a_commit(client: SignedClient, url: str, prefix: str, opts: dict) -> None:
    """delta-rs creates the table at ``url`` (``prefix``: its key in ``client``'s bucket or
    container) and appends to it; then a foreign writer takes the next version first: delta-rs,
    still at the version before, is refused, and the foreign commit is left as it was."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    write_deltalake(url, pa.table({"k": [1, 2]}), storage_options=opts)
    write_deltalake(url, pa.table({"k": [3]}), mode="append", storage_options=opts)
    dt = DeltaTable(url, storage_options=opts)
    assert dt.version() == 1
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == [1, 2, 3]
    log = [k.rsplit("/", 1)[1] for k in client.keys(f"{prefix}/_delta_log/") if k.endswith(".json")]
    assert log == [f"{v:020d}.json" for v in (0, 1)]

    stale = DeltaTable(url, storage_options=opts)
    foreign = json.dumps({"commitInfo": {"operation": "FOREIGN", "timestamp": 0}}).encode() + b"\n"
    assert client.put(f"{prefix}/_delta_log/{2:020d}.json", foreign, if_none_match="*") == client.created
    with pytest.raises(CommitFailedError):
        write_deltalake(
            stale, pa.table({"k": [4]}), mode="append", commit_properties=CommitProperties(max_commit_retries=0)
        )
    assert client.get(f"{prefix}/_delta_log/{2:020d}.json") == foreign


def race_delta_commits(url: str, opts: dict, values: list[int], retries: int | None) -> list[str]:
    """One delta-rs append per value, all from tables loaded at the same version and let go at
    once (``retries``: delta-rs's commit retries, None for its default). Returns each writer's
    outcome: "committed", "lost the race" (CommitFailedError) or any other error, named."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    tables = [DeltaTable(url, storage_options=opts) for _ in values]
    props = CommitProperties(max_commit_retries=retries) if retries is not None else None
    outcome = [""] * len(values)

    def commit(i: int) -> None:
        try:
            write_deltalake(tables[i], pa.table({"k": [values[i]]}), mode="append", commit_properties=props)
            outcome[i] = "committed"
        except CommitFailedError:
            outcome[i] = "lost the race"
        except Exception as exc:  # any other error is a finding: say which
            outcome[i] = f"{type(exc).__name__}: {exc}"

    at_once(len(values), commit)
    return outcome


def assert_one_racing_commit_lands_per_version(url: str, opts: dict, writers: int, rounds: int) -> None:
    """Round after round, of ``writers`` delta-rs appends racing for one version without retries
    exactly one lands; the table ends at version ``rounds`` holding the winners' rows."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(url, pa.table({"k": [0]}), storage_options=opts)
    expected = [0]
    for round_ in range(rounds):
        values = [round_ * 100 + i + 1 for i in range(writers)]
        outcome = race_delta_commits(url, opts, values, retries=0)
        assert sorted(outcome) == ["committed"] + ["lost the race"] * (writers - 1), outcome
        expected.append(values[outcome.index("committed")])
    dt = DeltaTable(url, storage_options=opts)
    assert dt.version() == rounds
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == sorted(expected)
