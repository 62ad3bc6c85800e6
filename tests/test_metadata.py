"""The ledger on SQLite and PostgreSQL: migrations, compare-and-set, the ledger's guards.

No Spark here: these tests drive :class:`reconcile.storage.ledger.Ledger` directly (mints
through :func:`reconcile.sink.mint.maybe_mint`, whose rules run inside the ledger's transaction),
and race threads against it to check that writers of one shard are linearized.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from reconcile import errors
from reconcile.manifest import Manifest, Part
from reconcile.model import COMMITTED, MINTED, OPEN_STATES, SUPERSEDED, CommitRecord, FeedProgress
from reconcile.sink.mint import maybe_mint
from reconcile.storage.engine import current_revision, downgrade, head, make_engine, upgrade
from reconcile.storage.ledger import Ledger, feed_of, now
from reconcile.storage.ledger_rows import Base, Batch, Shard

TABLES = {"reconcile_shards", "reconcile_batches"}
AS_OF = 100


def reconcile_tables(engine) -> set[str]:
    return {t for t in inspect(engine).get_table_names() if t.startswith("reconcile_")}


def race(n: int, fn):
    """Run fn(i) in n threads released together; [(i, result or exception)] in thread order."""
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def body(i):
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - collected and asserted on by the caller
            results[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung (deadlock?)"
    return list(enumerate(results))


# --- migrations -------------------------------------------------------------------------------


def test_migration_0003_moves_the_final_prefix_into_failure_kind(metadata_url):
    """Ledgers written before 0003 marked final failures with a ``final: `` message prefix."""
    from sqlalchemy import text

    engine = make_engine(metadata_url)
    try:
        upgrade(engine, "0002")
        row = "INSERT INTO reconcile_batches (batch_id, shard, lower, upper, state, attempt, message, created_at, updated_at) "
        with engine.begin() as c:
            c.execute(text(row + "VALUES ('b1', 's', 1, 2, 'staged', 1, 'final: bad input', :t, :t)"), {"t": now()})
            c.execute(text(row + "VALUES ('b2', 's', 2, 3, 'minted', 1, 'lost the database', :t, :t)"), {"t": now()})
        upgrade(engine)
        with engine.connect() as c:
            got = dict(c.execute(text("SELECT batch_id, failure_kind || ':' || message FROM reconcile_batches")).all())
        assert got == {"b1": "final:bad input", "b2": "retryable:lost the database"}
        downgrade(engine, "0002")
        with engine.connect() as c:
            back = c.execute(text("SELECT message FROM reconcile_batches WHERE batch_id = 'b1'")).scalar()
        assert back == "final: bad input"
    finally:
        engine.dispose()


def test_the_head_the_ledger_checks_is_alembic_s():
    """``head()`` lists the migration files instead of asking Alembic: each file's revision is its
    number, its down revision the one before, and the newest is the head Alembic finds."""
    from alembic.script import ScriptDirectory

    from reconcile.storage.engine import MIGRATIONS

    script = ScriptDirectory(str(MIGRATIONS))
    revisions = sorted(script.walk_revisions(), key=lambda r: r.revision)
    for before, rev in zip([None, *revisions], revisions, strict=False):
        assert rev.module.__file__.split("/")[-1][:4] == rev.revision  # type: ignore[union-attr]
        assert rev.down_revision == (before.revision if before else None)
    assert head() == script.get_current_head() == revisions[-1].revision


def test_upgrade_downgrade_upgrade(metadata_url):
    engine = make_engine(metadata_url)
    try:
        assert current_revision(engine) is None
        assert reconcile_tables(engine) == set()

        upgrade(engine)
        assert current_revision(engine) == head()
        assert reconcile_tables(engine) == TABLES

        downgrade(engine, "base")
        assert current_revision(engine) is None
        assert reconcile_tables(engine) == set()
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}  # only the version table is left

        upgrade(engine)
        assert current_revision(engine) == head()
        assert reconcile_tables(engine) == TABLES
        # the re-created schema works: a ledger on it needs no migration and can mint
        s = Ledger(metadata_url, auto_migrate=False)
        desc, why = maybe_mint(s, "again", AS_OF, "run-1", 1, 200)
        assert desc is not None and (desc.lower, desc.upper) == (AS_OF, 200), why
        s.dispose()
    finally:
        engine.dispose()


def test_models_agree_with_the_migrated_schema(ledger):
    insp = inspect(ledger.engine)
    assert reconcile_tables(ledger.engine) == set(Base.metadata.tables) == TABLES
    for name, table in Base.metadata.tables.items():
        db_cols = {c["name"]: c for c in insp.get_columns(name)}
        assert set(db_cols) == {c.name for c in table.columns}, name
        for col in table.columns:
            assert db_cols[col.name]["nullable"] == col.nullable, f"{name}.{col.name} nullability"
            db_type = db_cols[col.name]["type"]
            assert db_type._type_affinity is col.type._type_affinity or (
                # SQLite reflects BIGINT as BIGINT but an Integer affinity either way
                issubclass(db_type._type_affinity, col.type._type_affinity)
                or issubclass(col.type._type_affinity, db_type._type_affinity)
            ), f"{name}.{col.name}: model {col.type!r}, database {db_type!r}"
        assert insp.get_pk_constraint(name)["constrained_columns"] == [c.name for c in table.primary_key.columns]
        db_ix = {ix["name"]: (tuple(ix["column_names"]), bool(ix["unique"])) for ix in insp.get_indexes(name)}
        model_ix = {ix.name: (tuple(c.name for c in ix.columns), bool(ix.unique)) for ix in table.indexes}
        assert db_ix == model_ix, name

    # Alembic's own comparison finds nothing to migrate either
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with ledger.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    diffs = [d for d in diffs if not (isinstance(d, tuple) and "alembic_version" in str(d))]
    assert diffs == []


# --- compare-and-set and the ledger guards ----------------------------------------------------


def test_compare_and_set_upper(ledger):
    ledger.ensure_shard("cas", AS_OF)
    assert ledger.get_shard("cas").upper == 0

    ledger.compare_and_set_upper("cas", 0, 200)
    assert ledger.get_shard("cas").upper == 200

    with pytest.raises(errors.UpperMismatch) as info:
        ledger.compare_and_set_upper("cas", 100, 300)
    assert info.value.current == 200 and info.value.expected == 100
    assert "200" in str(info.value) and "'cas'" in str(info.value)
    assert ledger.get_shard("cas").upper == 200  # unchanged by the failed CAS

    ledger.compare_and_set_upper("cas", 200, 300)
    assert ledger.get_shard("cas").upper == 300


def test_partial_unique_index_refuses_a_second_committed_batch_per_lower(ledger):
    ledger.ensure_shard("uq", AS_OF)
    first = CommitRecord(version=1, batch_id="100-first", lower=AS_OF, upper=200, run_id="r1")
    assert ledger.absorb_commit("uq", first) is True
    assert ledger.get_shard("uq").upper == 200

    # a later Delta version claiming the same lower for another batch: the index refuses it
    second = CommitRecord(version=2, batch_id="100-second", lower=AS_OF, upper=200, run_id="r2")
    with pytest.raises(errors.InconsistentState) as info:
        ledger.absorb_commit("uq", second)
    assert "lower 1970-01-01T00:00:00.100Z (100)" in str(info.value) and "Remedy:" in str(info.value)
    # the refused absorb rolled back completely
    shard = ledger.get_shard("uq")
    assert (shard.upper, shard.delta_version) == (200, 1)
    assert [(b.batch_id, b.state) for b in ledger.batches("uq")] == [("100-first", COMMITTED)]


def test_unique_index_is_partial_on_committed_state(ledger):
    """The database itself refuses two committed rows per (shard, lower), and only committed ones."""
    t = datetime.now(UTC)

    def row(batch_id, state, shard="ix"):
        return Batch(
            batch_id=batch_id, shard=shard, lower=AS_OF, upper=200, state=state, attempt=1, created_at=t, updated_at=t
        )

    with Session(ledger.engine) as s, s.begin():
        s.add_all(
            [
                row("a", SUPERSEDED),
                row("b", SUPERSEDED),
                row("c", MINTED),
                row("d", COMMITTED),
                row("e", COMMITTED, shard="other"),
            ]
        )
    with pytest.raises(IntegrityError):
        with Session(ledger.engine) as s, s.begin():
            s.add(row("f", COMMITTED))
    assert sorted(b.batch_id for b in ledger.batches("ix")) == ["a", "b", "c", "d"]


def test_absorb_commit_is_idempotent(ledger):
    rec = CommitRecord(version=3, batch_id="100-x", lower=AS_OF, upper=250, run_id="r", rows_ok=4, rows_err=1)
    ledger.ensure_shard("idem", AS_OF)
    assert ledger.absorb_commit("idem", rec) is True
    assert ledger.absorb_commit("idem", rec) is False
    shard = ledger.get_shard("idem")
    assert (shard.upper, shard.delta_version) == (250, 3)
    b = ledger.get_batch("100-x")
    assert (b.state, b.delta_version, b.lower, b.upper, b.rows_ok, b.rows_err) == (COMMITTED, 3, AS_OF, 250, 4, 1)
    assert len(ledger.batches("idem")) == 1


def test_absorb_commit_records_a_feed_s_progress_in_two_columns(ledger):
    """The ledger keeps a feed's late commands and offset (not its commands); the offset is the watermark."""
    ledger.ensure_shard("fp", AS_OF)
    feed = FeedProgress.recorded(2, 41)
    rec = CommitRecord(version=1, batch_id="100-fp", lower=AS_OF, upper=200, run_id="r", feed=feed)
    assert ledger.absorb_commit("fp", rec) is True
    b = ledger.get_batch("100-fp")
    assert (b.late_commands, b.source_offset) == (2, 41)
    assert feed_of(b) == feed == FeedProgress(None, 2, 41)
    assert ledger.watermark("fp") == 41
    assert FeedProgress.recorded(None, None) is None


def test_a_manifest_keeps_a_feed_s_flat_keys():
    """A feed's progress is three flat keys of the manifest's text (a None kept); a text with some of
    them (a Delta commit's: no commands) reads the others as None; another kind's has none."""
    progress = FeedProgress(commands=3, late_commands=1, source_offset=None)
    m = Manifest("100-m", AS_OF, 200, 1, {0: Part(rows=1)}, feed=progress)
    raw = json.loads(m.to_json())
    assert {k: raw.get(k, "absent") for k in FeedProgress.KEYS} == {
        "commands": 3,
        "late_commands": 1,
        "source_offset": None,
    }
    assert Manifest.from_json(m.to_json()).feed == progress
    assert Manifest.from_json(m.to_json()).to_json() == m.to_json()
    commit = {k: v for k, v in raw.items() if k != "commands"}
    assert Manifest.from_dict(commit).feed == FeedProgress(None, 1, None)
    other = Manifest("100-m", AS_OF, 200, 1, {0: Part(rows=1)})
    assert not set(FeedProgress.KEYS) & set(json.loads(other.to_json()))
    assert Manifest.from_json(other.to_json()).feed is None


def test_absorb_commit_supersedes_open_batches_below_the_new_upper(ledger):
    a, _ = maybe_mint(ledger, "sup", AS_OF, "run-a", 1, 300)
    rec = CommitRecord(version=1, batch_id="100-winner", lower=AS_OF, upper=200, run_id="run-w")
    assert ledger.absorb_commit("sup", rec) is True
    assert ledger.get_batch(a.batch_id).state == SUPERSEDED
    assert "100-winner" in ledger.get_batch(a.batch_id).message


def test_a_final_failure_needs_action_until_settled_then_stays_as_history_without_its_remedy(ledger):
    """A final failure of an open batch is red (``bad``) and needs action; once a newer run's
    mint supersedes it, or a later write attempt stages it and it commits, its cause stays in the
    ledger as history (grey, or on the committed batch), its remedy gone."""
    from reconcile.model import FINAL, Staged
    from reconcile.report import needs_action
    from reconcile.standing import BAD, DONE, OK, standing

    cause = "sink 'hist': the Airflow connection 'spark_x' the sink's write runs on isn't defined"
    failed = f"{cause} Remedy: define it. Once the cause is fixed, rerun the run's write: `airflow ...`."
    old, _ = maybe_mint(ledger, "hist", AS_OF, "run-old", 1, 200)
    ledger.note_failure(old.batch_id, failed, FINAL)
    how = standing(ledger.get_batch(old.batch_id), AS_OF)
    assert (how.tone, how.note_tone, how.note) == (BAD, BAD, f"final: {failed}")
    assert needs_action(ledger.batches("hist"), AS_OF, []) == [
        f"batch {old.batch_id} [{_iso(AS_OF)}, {_iso(200)}): final: {failed}"
    ]
    new, _ = maybe_mint(ledger, "hist", AS_OF, "run-new", 1, 300)  # the next run supersedes it
    b = ledger.get_batch(old.batch_id)
    assert (b.state, b.failure_kind) == (SUPERSEDED, None)
    assert b.message == f"superseded by batch {new.batch_id} of run run-new; earlier failure: final: {cause}"
    how = standing(b, AS_OF)
    assert (how.tone, how.note_tone, how.note) == (DONE, DONE, b.message) and "Remedy" not in how.note
    assert needs_action(ledger.batches("hist"), AS_OF, []) == []

    ledger.note_failure(new.batch_id, failed, FINAL)  # the newer batch fails too, then is fixed
    staged = Staged("s1", "{}", rows_ok=1, rows_err=0, read_version=0, drift_rows=0)
    assert ledger.mark_staged(new.batch_id, staged, replaces=None)[0]
    b = ledger.get_batch(new.batch_id)
    assert (b.state, b.failure_kind, b.message) == ("staged", None, f"earlier failure: final: {cause}")
    assert not standing(b, AS_OF).unresolved
    ledger.absorb_commit(
        "hist", CommitRecord(version=1, batch_id=new.batch_id, lower=AS_OF, upper=300, run_id="run-new")
    )
    how = standing(ledger.get_batch(new.batch_id), 300)
    assert (how.tone, how.note) == (
        OK,
        f"resolved (a later attempt committed it at Delta version 1); earlier failure: final: {cause}",
    )


def _iso(ms: int) -> str:
    from reconcile.log import iso

    return iso(ms)


# --- concurrency ------------------------------------------------------------------------------


def test_concurrent_compare_and_set_has_exactly_one_winner(ledger):
    ledger.ensure_shard("race", AS_OF)
    n = 8
    results = race(n, lambda i: ledger.compare_and_set_upper("race", 0, 1000 + i))
    winners = [i for i, r in results if r is None]
    assert len(winners) == 1, results
    won = 1000 + winners[0]
    assert ledger.get_shard("race").upper == won
    losers = [r for i, r in results if i != winners[0]]
    assert all(isinstance(r, errors.UpperMismatch) and r.current == won for r in losers), losers


def test_attempts_advancing_a_new_shard_to_as_of_all_go_on(ledger):
    """Attempts of the same first batch advance a new shard's upper to as_of at once: one moves
    it, none fails, and an upper already past as_of is never moved back."""
    ledger.ensure_shard("asof", AS_OF)
    results = race(6, lambda i: ledger.advance_to_as_of("asof", AS_OF))
    assert sorted(r for _, r in results) == [0] + [AS_OF] * 5, results
    assert ledger.get_shard("asof").upper == AS_OF
    ledger.compare_and_set_upper("asof", AS_OF, 300)
    assert ledger.advance_to_as_of("asof", AS_OF) == 300 and ledger.get_shard("asof").upper == 300


def test_concurrent_mints_share_a_lower_and_leave_one_open(ledger):
    ledger.ensure_shard("mints", AS_OF)
    n = 6
    results = race(n, lambda i: maybe_mint(ledger, "mints", AS_OF, f"run-{i}", 1, 500))
    descs = [r[0] if isinstance(r, tuple) else r for _, r in results]
    assert all(d is not None and not isinstance(d, Exception) for d in descs), results
    assert {(d.lower, d.upper) for d in descs} == {(AS_OF, 500)}
    assert len({d.batch_id for d in descs}) == n

    batches = ledger.batches("mints")
    assert len(batches) == n
    still_open = [b for b in batches if b.state in OPEN_STATES]
    assert len(still_open) == 1 and still_open[0].state == MINTED
    assert all(b.state == SUPERSEDED for b in batches if b is not still_open[0])
    # the mints were linearized: "superseded by" links every description to the next one minted,
    # one chain through all n, ending at the one left open
    successor = {
        b.batch_id: re.search(r"superseded by batch (\S+)", b.message).group(1)
        for b in batches
        if b.state == SUPERSEDED
    }
    first = (set(successor) - set(successor.values())).pop()
    chain = [first]
    while chain[-1] in successor:
        chain.append(successor[chain[-1]])
    assert len(chain) == n and chain[-1] == still_open[0].batch_id
    assert ledger.get_shard("mints").last_minted_lower == AS_OF


def test_concurrent_first_mints_of_a_new_shard(ledger):
    """Several runs of a brand-new sink mint at once: the shard row is created once, no error."""
    n = 4
    results = race(n, lambda i: maybe_mint(ledger, "fresh", AS_OF, f"run-{i}", 1, 500))
    failures = [r for _, r in results if isinstance(r, Exception)]
    assert failures == [], failures
    batches = ledger.batches("fresh")
    assert len(batches) == n and len([b for b in batches if b.state in OPEN_STATES]) == 1


def test_mint_while_another_process_creates_the_shard_row(ledger):
    """Another writer's transaction creates the new shard's row and has not committed yet.

    The mint must wait for it and then use that row: a check-then-insert would find no row
    (the insert is invisible), insert too and fail on the primary key once the other commits.
    """
    other = make_engine(ledger.url)
    result: dict = {}

    def mint():
        try:
            result["mint"] = maybe_mint(ledger, "fresh", AS_OF, "run-late", 1, 500)
        except Exception as exc:  # noqa: BLE001 - asserted below
            result["mint"] = exc

    try:
        with Session(other) as s:
            s.begin()
            t = datetime.now(UTC)
            s.add(Shard(**Shard.initial("fresh", AS_OF, at=t)))
            s.flush()
            thread = threading.Thread(target=mint)
            thread.start()
            thread.join(timeout=1.5)
            assert thread.is_alive(), f"the mint did not wait for the uncommitted shard row: {result}"
            s.commit()
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        other.dispose()
    desc, why = result["mint"] if isinstance(result["mint"], tuple) else (result["mint"], None)
    assert not isinstance(desc, Exception), repr(desc)
    assert desc is not None and (desc.lower, desc.upper) == (AS_OF, 500), why
    assert [b.batch_id for b in ledger.batches("fresh")] == [desc.batch_id]


# --- failures ---------------------------------------------------------------------------------


def test_unreachable_database_is_metadata_unavailable():
    url = "postgresql+psycopg://nobody:x@127.0.0.1:1/none"
    with pytest.raises(errors.MetadataUnavailable) as info:
        Ledger(url)
    text = str(info.value)
    assert "postgresql+psycopg://nobody:***@127.0.0.1:1/none" in text
    assert ":x@" not in text
    assert "unreachable" in text
    assert "Remedy:" in text and "RECONCILE_METADATA_URL" in text and "retries" in text
    assert isinstance(info.value, errors.Retryable)


def test_missing_shard_and_batch_are_named(ledger):
    with pytest.raises(errors.ShardNotFound, match="'ghost'"):
        ledger.get_shard("ghost")
    with pytest.raises(errors.ShardNotFound):
        ledger.set_read_only("ghost", True)
    with pytest.raises(errors.BatchNotFound, match="nope"):
        ledger.get_batch("nope")
