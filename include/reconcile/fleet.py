"""A fleet's health in one place: every sink's state, the sinks needing action first, with
counts per state. What ``python -m reconcile status`` prints without a sink (``--json`` for
monitoring) and what the shard pages' overview shows.

It costs a few ledger queries for the whole fleet (every shard's row, its newest batches and its
batches past its upper: :meth:`~reconcile.storage.ledger.Ledger.newest_batches`,
:meth:`~reconcile.storage.ledger.Ledger.pending_batches`), not a query per sink, and one probe of
each shard's Delta log (does a version follow the last one the ledger knows?); a sink's log is
read (:func:`reconcile.report.foreign_unrepaired`, as ``status SINK`` reads it) only when the
ledger cannot tell that every version since its newest batches is one of its batch commits.

States, most urgent first (:data:`STATES`); the first five need someone to act:

- ``invalid``: the sink file does not load (Airflow shows ``invalid_sink_config__<file>``);
- ``failed``: a failure no retry resolves, or a foreign write the feed cannot repair
  (``status SINK``'s NEEDS ACTION lines);
- ``late``: its upper lags now by more than its alert threshold (``alert.lag_minutes``, else
  twice the schedule's interval; not for a read-only shard);
- ``unrepaired``: foreign Delta versions no batch repaired yet (the next batch repairs them);
- ``current_lagging``: its current-state table is behind the shard, missing, or holds a foreign
  commit (the next append mends it);
- ``behind``: a superseded run left the shard behind (``status SINK`` names the run to clear);
- ``new``: no run minted a batch yet; ``ok``.

A sink's ``exit_code`` is what ``status SINK`` exits with (:func:`reconcile.report.exit_code`);
the fleet's is the worst of them: 1 (needs action) over 4 (foreign versions not yet repaired)
over 0.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from reconcile.config import SinkConfig
from reconcile.log import iso
from reconcile.model import COMMITTED
from reconcile.report import duration, exit_code, needs_action, stamp
from reconcile.schedule import schedule_period_ms

STATES = {
    "invalid": "the sink file does not load: no DAG runs it",
    "failed": "a failure no retry resolves",
    "late": "lagging past its alert threshold",
    "unrepaired": "foreign Delta versions not yet repaired",
    "current_lagging": "its current-state table lags the shard",
    "behind": "a superseded run left the shard behind",
    "new": "no batch minted yet",
    "ok": "",
}
ACTION = ("invalid", "failed", "late", "unrepaired", "current_lagging")
WINDOW = 10  # the newest batches whose foreign versions status looks at (report.foreign_unrepaired)


def lag_limit_ms(cfg: SinkConfig) -> int | None:
    """When a sink counts as late: ``alert.lag_minutes``, else twice its schedule's period (None:
    no recurring schedule)."""
    if cfg.alert.lag_minutes is not None:
        return cfg.alert.lag_minutes * 60_000
    period = _period_ms(cfg.schedule)
    return 2 * period if period else None


@functools.lru_cache(maxsize=1024)
def _period_ms(schedule: str | None) -> int | None:
    """:func:`~reconcile.schedule.schedule_period_ms`, once per schedule (a fleet shares a few;
    croniter costs about a millisecond a call)."""
    return schedule_period_ms(schedule)


@dataclass
class SinkHealth:
    """One sink's line: its ``state`` and what the views show (the ledger rows kept for pages)."""

    name: str
    kind: str
    state: str = "ok"
    cfg: SinkConfig | None = None
    shard: Any = None  # its ledger row (None: no run minted yet)
    last: Any = None  # its newest batch
    pending: list = field(default_factory=list)  # its batches not committed past its upper
    needs: list[str] = field(default_factory=list)  # status SINK's NEEDS ACTION lines
    unrepaired: list[dict] | None = field(default_factory=list)  # None: the Delta log unreadable
    current: str | None = None  # why its current-state table lags (None: it does not)
    behind: str | None = None  # the BEHIND line
    late: bool = False
    lag_ms: int | None = None
    lag_limit_ms: int | None = None
    invalid: bool = False  # its sink file does not load (``needs`` says why)

    @property
    def needs_action(self) -> bool:
        return self.state in ACTION

    @property
    def exit_code(self) -> int:
        """``status SINK``'s exit code."""
        return exit_code(self.needs, [(f["version"], f.get("why") or "") for f in self.unrepaired or []])

    def reason(self) -> str:
        """One line: what is wrong (the most urgent first), else how its newest batch stands."""
        late = (
            f"lags {duration(self.lag_ms or 0)} behind now (alert past {duration(self.lag_limit_ms or 0)})"
            if self.late
            else None
        )
        versions = ", ".join(str(f["version"]) for f in self.unrepaired or [])
        foreign = f"foreign Delta versions {versions} not yet repaired" if versions else None
        lines = [*self.needs, late, foreign, self.current, self.behind]
        said = [line for line in lines if line]
        if said:
            return "; ".join(said)
        if self.shard is None:
            return "no shard yet (no run minted)"
        if self.last is None:
            return "no batch yet"
        b = self.last
        return f"last batch [{iso(b.lower)}, {iso(b.upper)}) {b.state}"

    def to_json(self) -> dict:
        """``status --json``'s entry of the sink (times as ``{"ms", "iso"}``)."""
        s, b = self.shard, self.last
        return {
            "sink": self.name,
            "kind": self.kind,
            "state": self.state,
            "needs_action": self.needs_action,
            "exit_code": self.exit_code,
            "reason": self.reason(),
            "upper": stamp(s.upper) if s is not None else None,
            "since": stamp(s.since) if s is not None and s.since else None,
            "lag_ms": self.lag_ms,
            "lag_limit_ms": self.lag_limit_ms,
            "late": self.late,
            "read_only": bool(s.read_only) if s is not None else None,
            "last_batch": None
            if b is None
            else {
                "batch_id": b.batch_id,
                "lower": stamp(b.lower),
                "upper": stamp(b.upper),
                "state": b.state,
                "run_id": b.run_id,
                "failure_kind": b.failure_kind,
            },
            "needs": self.needs,
            "foreign_unrepaired": self.unrepaired,
            "current": self.current,
            "behind": self.behind,
        }


def survey(
    ledger, configs: list[SinkConfig], errors: list, now: int, *, delta: bool = True, can_read=None
) -> list[SinkHealth]:
    """Every sink of ``configs`` (and each invalid file of ``errors``), the sinks needing action
    first (by :data:`STATES`' order, then name). ``delta``: probe the Delta logs (foreign versions,
    the current-state tables); ``can_read(name)``: only the sinks it allows."""
    from reconcile import standing as st
    from reconcile.config_messages import problems_of

    allowed = can_read or (lambda name: True)
    shards = {s.name: s for s in ledger.shards()}
    newest = ledger.newest_batches(WINDOW + 1)
    pending = ledger.pending_batches()
    out: list[SinkHealth] = []
    for cfg in configs:
        if not allowed(cfg.name):
            continue
        h = SinkHealth(cfg.name, cfg.kind, cfg=cfg, shard=shards.get(cfg.name), lag_limit_ms=lag_limit_ms(cfg))
        window = newest.get(cfg.name, [])
        h.last = window[0] if window else None
        h.pending = pending.get(cfg.name, [])
        if h.shard is not None:
            upper = h.shard.upper
            h.lag_ms = now - upper
            h.late = not h.shard.read_only and h.lag_limit_ms is not None and h.lag_ms > h.lag_limit_ms
            left = st.behind(h.pending, upper)
            h.behind = None if left is None else f"BEHIND: {left.line(cfg.name)}"
        out.append(h)
    if delta:
        _probe_logs(ledger, [h for h in out if h.shard is not None], newest)
    for h in out:
        if h.shard is not None:
            pairs = [(_Version(f["version"]), f.get("why") or "") for f in h.unrepaired or []]
            h.needs = needs_action(h.pending, h.shard.upper, pairs)
        h.state = _state(h)
    for err in errors:
        from pathlib import Path

        stem = Path(err.path).stem
        if not allowed(stem):
            continue
        h = SinkHealth(stem, "?", "invalid", shard=shards.get(stem), invalid=True)
        said = "; ".join(str(p) for p in problems_of(err))  # every problem of the file, on one line
        h.needs = [f"the sink file does not load, so Airflow runs no DAG for it and nothing is written: {said}"]
        out.append(h)
    order = {state: i for i, state in enumerate(STATES)}
    return sorted(out, key=lambda h: (order[h.state], h.name))


@dataclass(frozen=True)
class _Version:
    """A foreign version as :func:`reconcile.report.needs_action` reads it (its ``version``)."""

    version: int


def _state(h: SinkHealth) -> str:
    if h.invalid:
        return "invalid"
    if h.needs:
        return "failed"
    if h.late:
        return "late"
    if h.unrepaired:
        return "unrepaired"
    if h.current:
        return "current_lagging"
    if h.behind:
        return "behind"
    if h.shard is None:
        return "new"
    return "ok"


def counts(healths: Iterable[SinkHealth]) -> dict[str, int]:
    """{state: how many sinks}, every state listed (most urgent first)."""
    found = Counter(h.state for h in healths)
    return {state: found.get(state, 0) for state in STATES}


def fleet_exit_code(healths: Iterable[SinkHealth]) -> int:
    """The worst of the sinks' ``status SINK`` exit codes: 1 over 4 over 0."""
    codes = {h.exit_code for h in healths}
    return 1 if 1 in codes else 4 if 4 in codes else 0


def counts_line(healths: list[SinkHealth]) -> str:
    """``1000 sinks: 2 failed, 1 late, 997 ok``: every state that has a sink, most urgent first."""
    c = counts(healths)
    parts = [f"{n} {state.replace('_', ' ')}" for state, n in c.items() if n]
    return f"{len(healths)} sink(s): " + (", ".join(parts) if parts else "none")


# -- the Delta logs: probed, read only where the ledger cannot tell ------------------------------


def _probe_logs(ledger, healths: list[SinkHealth], newest: dict[str, list]) -> None:
    """Each sink's foreign versions not yet repaired and its current-state table's lag, from
    probes of its Delta logs (in parallel on an object store: each probe is a round trip)."""
    from reconcile import settings

    def probe(h: SinkHealth) -> None:
        try:
            latest = _foreign(ledger, h, newest.get(h.name, []))
        except Exception:  # noqa: BLE001 - an unreadable log leaves the sink to the ledger
            h.unrepaired, latest = None, None
        if h.cfg is not None and h.cfg.current is not None:
            try:
                h.current = _current_lag(h.cfg, latest)
            except Exception as exc:  # noqa: BLE001 - said as the lag's cause
                h.current = f"current table unreadable: {str(exc)[:200]}"

    if settings.store_of(settings.warehouse()) is None:
        for h in healths:
            probe(h)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(probe, healths))


UNACCOUNTED_READ = 5  # versions of the window that are no batch's own commit, read one by one


def _foreign(ledger, h: SinkHealth, window: list) -> int | None:
    """Sets ``h.unrepaired`` (as ``status SINK`` lists them); returns the shard's latest Delta
    version (None: no table). Versions follow one another and the ledger records each batch's
    own, so the versions since the batch before the newest :data:`WINDOW` batches that are no
    batch's commit (a compaction, a foreign write) are known without listing the log: each is
    read (up to :data:`UNACCOUNTED_READ`), and one probe past the newest version the ledger knows
    says whether the log holds more. The log is read as ``status SINK`` reads it
    (:func:`reconcile.report.foreign_unrepaired`) only when a version may be a foreign write."""
    from reconcile import report
    from reconcile.storage import files
    from reconcile.storage.delta import ShardTable

    assert h.cfg is not None
    table = ShardTable(h.cfg)
    shown, before = window[:WINDOW], window[WINDOW:]
    first = min((b.lower for b in shown), default=None)
    prev = (
        before[0] if before and before[0].state == COMMITTED and first is not None and before[0].lower < first else None
    )
    if before and prev is None:  # the committed batch before the shown ones is further back
        h.unrepaired = report.foreign_unrepaired(ledger, h.name, WINDOW)
        return table.latest_version() if table.exists() else None
    base = -1 if prev is None or prev.read_version is None else prev.read_version
    ours = {b.delta_version for b in [*shown, *before[:1]] if b.state == COMMITTED and b.delta_version is not None}
    latest = max([h.shard.delta_version, *ours], default=-1)
    unaccounted = [v for v in range(base + 1, latest + 1) if v not in ours]
    clean = len(unaccounted) <= UNACCOUNTED_READ and not files.path_exists(f"{table.log_path}/{latest + 1:020d}.json")
    for v in unaccounted if clean else []:
        present, meta = table.version_description(v)
        clean = clean and present and meta is not None  # the sink's own (a compaction, the creation)
    if clean:
        h.unrepaired = []
        return latest if latest >= 0 else None
    h.unrepaired = report.foreign_unrepaired(ledger, h.name, WINDOW)
    return table.latest_version() if table.exists() else None


def _current_lag(cfg: SinkConfig, shard_latest: int | None) -> str | None:
    """Why the sink's current-state table lags the shard (None: it reflects the shard's latest
    version), from its log's last commit: the shard version it reflects (its application
    transaction), or a commit of another writer."""
    from reconcile.storage import files
    from reconcile.storage.commits import parse_actions
    from reconcile.storage.current import CurrentTable
    from reconcile.storage.delta import ShardTable, log_versions

    ct = CurrentTable(cfg)
    versions = log_versions(ct.log_path)
    if not versions:  # lagging only once the shard has a table (as ``status SINK`` says)
        shard_log = ShardTable(cfg).log_path
        if shard_latest is None or not files.path_exists(f"{shard_log}/{shard_latest:020d}.json"):
            return None
        return "current table not created yet: the next append creates it"
    text = files.read_text(f"{ct.log_path}/{versions[-1]:020d}.json") or ""
    txn = [a["txn"] for a in parse_actions(text) if a.get("txn", {}).get("appId") == ct.app_id]
    if not txn:
        if versions[-1] == 0:
            return None if shard_latest is None else "current table empty: the next append fills it"
        return f"current table: a foreign commit (version {versions[-1]}): the next append rebuilds it"
    reflected = int(txn[0]["version"])
    if shard_latest is not None and reflected < shard_latest:
        return (
            f"current table reflects shard version {reflected}, behind the shard's {shard_latest}: "
            "the next append completes it"
        )
    return None


def fleet_json(healths: list[SinkHealth], now: int) -> dict:
    """``status --json`` without a sink: the counts, the fleet's exit code, every sink's entry."""
    return {
        "now": stamp(now),
        "sinks_total": len(healths),
        "needs_action": sum(h.needs_action for h in healths),
        "counts": counts(healths),
        "exit_code": fleet_exit_code(healths),
        "sinks": [h.to_json() for h in healths],
    }


def print_fleet(healths: list[SinkHealth], now: int, out: Callable[[str], None] = print) -> None:
    """``status``'s text without a sink: the counts, then one line a sink, needing action first."""
    out(f"{counts_line(healths)} (needing action: {sum(h.needs_action for h in healths)}; now {iso(now)})")
    if not healths:
        return
    width = max(len(h.name) for h in healths)
    out(f"{'state':<16} {'sink':<{width}} {'kind':<9} {'upper (UTC)':<24} {'lag':>11}  why / last batch")
    for h in healths:
        upper = iso(h.shard.upper).split(" ")[0] if h.shard is not None else "-"
        lag = duration(h.lag_ms) if h.lag_ms is not None else "-"
        out(f"{h.state:<16} {h.name:<{width}} {h.kind:<9} {upper:<24} {lag:>11}  {h.reason()}")
