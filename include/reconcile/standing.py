"""How each batch stands for the on-call engineer, from the ledger (and, for drift, the Delta
log): what ``status``, the pages, the tasks' last log line and ``check`` say about it.

Tones (a page's colours; ``status`` words them):

- ``ok``: committed, nothing wrong;
- ``bad``: an unresolved failure someone must act on (a final failure of an open batch);
- ``warn``: in flight or retrying by itself; or the shard left behind by a superseded batch;
- ``done`` (grey): settled, nothing to do: a superseded or covered description, or a failure a
  later attempt resolved (the batch committed) or a later batch covered (the shard's upper
  passed the batch's upper). The ledger keeps the failure; it is shown as history.

**Left behind**: a superseded description whose interval the shard does not reach and that no
open description covers (the scheduled catch-up run that lost the race to a backfill: green,
yet the shard stays behind until the next scheduled run). :func:`behind` names the run to clear
now, with a command that works on Airflow 3.3, paused or not:
``airflow dags unpause SINK && airflow dags clear SINK --run-id RUN -y`` (clears that run by id,
manual or scheduled; its mint then describes the rest anew from the shard's upper), or without
Airflow ``python -m reconcile run SINK --frontier UPPER``.

**Drift**: a foreign Delta version (:meth:`~reconcile.storage.delta.ShardTable.foreign_commits`) is
repaired only once a committed batch did repair it (:func:`fates`): for query and change-log
sinks the first batch whose write read it; for upsert sinks the first batch that repaired by key
after it, and only once every key it touched is defined by the feed again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from reconcile import remedy
from reconcile.log import iso
from reconcile.model import COMMITTED, FINAL, OPEN_STATES, RETRYABLE, SUPERSEDED
from reconcile.storage.commits import ForeignCommit
from reconcile.storage.ledger_rows import EARLIER, Batch, cause_of, failure_history

OK, BAD, WARN, DONE = "ok", "bad", "warn", "done"


@dataclass(frozen=True)
class Standing:
    """``tone`` of the batch's state, and ``note`` (one line or None) with ``note_tone``."""

    tone: str
    note: str | None = None
    note_tone: str = DONE

    @property
    def unresolved(self) -> bool:
        return self.tone == BAD or self.note_tone == BAD


def standing(b, shard_upper: int) -> Standing:
    """How batch ``b`` (a ledger row) stands, given the shard's upper now. A failure recorded on
    it and settled since (committed, superseded, covered, or staged by a later write attempt) is
    said as history: its cause, not its remedy (:func:`~reconcile.storage.ledger_rows.failure_history`)."""
    kind = f"{b.failure_kind}: " if b.failure_kind else ""
    history = failure_history(b)
    if b.state == COMMITTED:
        if history:
            at = f" at Delta version {b.delta_version}" if b.delta_version is not None else ""
            return Standing(OK, f"resolved (a later attempt committed it{at}); {EARLIER}{history}")
        return Standing(OK)
    if b.state == SUPERSEDED:
        return Standing(DONE, cause_of(b.message) or "superseded", DONE)
    # an open description (minted or staged)
    was = f"; {EARLIER}{history}" if history else ""
    if shard_upper >= b.upper:
        return Standing(DONE, f"covered: a later batch took the shard to {iso(shard_upper)}{was}")
    if shard_upper > b.lower:
        return Standing(DONE, f"outdated: another batch moved the shard past its lower{was}")
    if b.failure_kind == FINAL:
        return Standing(BAD, f"{kind}{b.message}", BAD)
    if b.failure_kind == RETRYABLE:
        return Standing(WARN, f"{kind}{b.message}", WARN)
    return Standing(WARN, b.message or None, WARN)


# -- the shard left behind -------------------------------------------------------------------------


@dataclass(frozen=True)
class Behind:
    """The shard's upper is behind a superseded description's upper that nothing in flight covers."""

    batch_id: str
    run_id: str | None
    lower: int  # the shard's upper: where the rest starts
    upper: int  # the superseded description's upper

    def commands(self, sink: str) -> list[str]:
        """Complete commands that append ``[lower, upper)`` now."""
        return ([remedy.clear_run(sink, self.run_id)] if self.run_id else []) + [remedy.catch_up(sink, self.upper)]

    def line(self, sink: str) -> str:
        """One line: what is behind, why, and what to run."""
        cmds = self.commands(sink)
        how = f"clear its run now: `{cmds[0]}`" + (f" (or without Airflow: `{cmds[1]}`)" if len(cmds) > 1 else "")
        if not self.run_id:
            how = f"append it now: `{cmds[0]}`"
        run = f"run {self.run_id}" if self.run_id else "a run"
        return (
            f"the shard is behind: {run} described [{iso(self.lower)}, {iso(self.upper)}) but its batch "
            f"{self.batch_id} was superseded and nothing in flight appends the rest; until the next run, "
            f"{how}"
        )


def behind(batches: Iterable, shard_upper: int) -> Behind | None:
    """The superseded description whose upper is furthest beyond the shard's upper, when no open
    description reaches that far (its run, cleared, appends the rest); else None."""
    rows = list(batches)
    left = [b for b in rows if b.state == SUPERSEDED and b.upper > shard_upper]
    if not left:
        return None
    far = max(left, key=lambda b: (b.upper, b.created_at))
    if any(b.state in OPEN_STATES and b.upper >= far.upper and b.lower >= shard_upper for b in rows):
        return None
    return Behind(far.batch_id, far.run_id, shard_upper, far.upper)


# -- drift: the foreign Delta versions each batch repaired ---------------------------------------


@dataclass(frozen=True)
class Fate:
    """How a foreign Delta version stands: repaired by ``batch`` (None: not yet), and ``why`` not."""

    batch: Batch | None
    why: str = "not yet repaired: the next batch of the sink repairs it"

    @property
    def repaired(self) -> bool:
        return self.batch is not None


def record_of(b: Batch) -> dict | None:
    """What batch ``b``'s write recorded of the foreign writes it repaired (its manifest's
    ``drift``: the versions, the mode, the keys an upsert feed cannot define); None: written
    before batches recorded it."""
    import json

    try:
        raw = json.loads(b.manifest or "")
    except ValueError:
        return None
    rec = raw.get("drift") if isinstance(raw, dict) else None
    return rec if isinstance(rec, dict) else None


def fates(committed: list[Batch], foreign: list[ForeignCommit], by_key: bool) -> dict[int, Fate]:
    """{foreign version: its fate}. A sink whose batches compare the whole collection (query,
    change log): repaired by the first committed batch whose write read that version or a later
    one. A sink repaired by key (upsert, ``by_key``): by the first batch after it that recorded a
    repair by key, once the keys the feed cannot define are repaired too (a batch that recorded
    none left); batches written before batches repaired by key repaired nothing."""
    ordered = sorted((b for b in committed if b.read_version is not None), key=lambda b: b.lower)
    out: dict[int, Fate] = {}
    for f in foreign:
        after = [b for b in ordered if (b.read_version or 0) >= f.version]
        if not by_key:
            out[f.version] = Fate(after[0] if after else None)
            continue
        recorded = [(b, r) for b in after if (r := record_of(b)) is not None]
        done = next((b for b, r in recorded if not r.get("unrepairable_count")), None)
        if done is not None or not recorded:
            out[f.version] = Fate(done)
            continue
        r = recorded[-1][1]
        sample = ", ".join(json_key(k) for k in (r.get("unrepairable") or [])[:5])
        out[f.version] = Fate(
            None,
            f"not repairable: {r.get('unrepairable_count')} key(s) foreign writes touched ({sample}) held a value "
            "but have no command in the feed (its retention dropped them, or the writer added keys the feed never "
            "had): put each key's last command back in the feed (for a key the feed never had, a delete command); "
            "the next batch repairs them",
        )
    return out


def json_key(k) -> str:
    import json

    return json.dumps(k, default=str, sort_keys=True)


def foreign_by_batch(fate: dict[int, Fate], foreign: list[ForeignCommit]) -> dict[str, list[ForeignCommit]]:
    """{batch id: the foreign versions it repaired}, from their :func:`fates`."""
    out: dict[str, list[ForeignCommit]] = {}
    for f in foreign:
        b = fate[f.version].batch
        if b is not None:
            out.setdefault(b.batch_id, []).append(f)
    return out


def with_rows(table, commits: list[ForeignCommit]) -> list[ForeignCommit]:
    """``commits`` with the rows of the files they removed looked up where the ``remove``
    actions carry no statistics (delta-rs): in the ``add`` actions of the version before."""
    from dataclasses import replace

    out = []
    for f in commits:
        if f.rows_removed is None and f.removed_paths:
            try:
                adds = table.snapshot(f.version - 1).get_add_actions(flatten=True)
                rows = dict(zip(adds.column("path").to_pylist(), adds.column("num_records").to_pylist(), strict=True))
                counts = [rows.get(p) for p in f.removed_paths]
                if all(c is not None for c in counts):
                    f = replace(f, rows_removed=int(sum(counts)))  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - the version before was cleaned up: rows unknown
                pass
        out.append(f)
    return out


def rows_text(f: ForeignCommit | dict) -> str:
    """``+2 -3 rows (net -1)``: what the version's added and removed files hold (``?`` where
    unknown); ``f`` a foreign commit or its :func:`foreign_json`."""
    d = foreign_json(f) if isinstance(f, ForeignCommit) else f
    added, removed = d["rows_added"], d["rows_removed"]

    def n(v: int | None) -> str:
        return "?" if v is None else str(v)

    if d["files_removed"] or removed:
        net = "" if added is None or removed is None else f" (net {added - removed:+d})"
        return f"+{n(added)} -{n(removed)} rows{net}"
    return f"+{n(added)} rows"


def foreign_json(f: ForeignCommit, repaired_at=None, why: str | None = None) -> dict:
    out = {
        "version": f.version,
        "operation": f.operation,
        "engine": f.engine,
        "user": f.user,
        "timestamp": f.timestamp,
        "rows_added": f.rows_added,
        "rows_removed": f.rows_removed,
        "files_removed": len(f.removed_paths),
    }
    if repaired_at is not None:
        out["repaired_at"] = repaired_at
    if why is not None:
        out["why"] = why
    return out
