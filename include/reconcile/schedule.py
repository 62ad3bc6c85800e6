"""Time arithmetic of a sink's runs: epoch milliseconds, a run's desired frontier, and the ticks
of its schedule (Airflow 3 triggers a cron schedule at each tick, UTC).

Every time the sink stores or compares is an integer of milliseconds since the epoch; this
module turns Airflow's datetimes and a sink's ``schedule`` into such integers. It reads no
ledger and no table.
"""

from __future__ import annotations

from datetime import UTC, datetime

CRON_OF_PRESET = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}


def to_millis(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def now_ms() -> int:
    """The current time in milliseconds since the epoch."""
    return to_millis(datetime.now(UTC))


def desired_frontier(data_interval_end: datetime | None, start: datetime | None) -> int:
    """The run's desired frontier: its data-interval end, else its start time."""
    moment = data_interval_end or start
    if moment is None:
        raise ValueError("a run needs a data interval end or a start time to mint a batch")
    return to_millis(moment)


def _cron(schedule: str | None) -> str | None:
    """The cron expression of a recurring schedule (a preset spelled out), else None."""
    cron = CRON_OF_PRESET.get(schedule or "", schedule)
    if not cron or cron.startswith("@"):
        return None
    return cron


def next_scheduled_frontier(schedule: str | None, catchup: bool, lower: int, now: int) -> int | None:
    """The upper the sink's next scheduled run would mint (its data-interval end), or None
    without a recurring schedule. With catchup the next run is the first tick after ``lower``;
    without it, the latest tick that has passed (if the shard is behind it), else the next tick
    to come."""
    from croniter import croniter

    cron = _cron(schedule)
    if cron is None:
        return None
    after = datetime.fromtimestamp(lower / 1000, UTC)
    first = to_millis(croniter(cron, after).get_next(datetime))
    if catchup or first > now:
        return first
    latest = to_millis(croniter(cron, datetime.fromtimestamp(now / 1000, UTC)).get_prev(datetime))
    return latest if latest > lower else first


def schedule_period_ms(schedule: str | None) -> int | None:
    """The time between two runs of a recurring schedule (its first two ticks after the epoch
    year 2026), or None."""
    from croniter import croniter

    cron = _cron(schedule)
    if cron is None:
        return None
    it = croniter(cron, datetime(2026, 1, 1, tzinfo=UTC))
    first = it.get_next(datetime)
    return to_millis(it.get_next(datetime)) - to_millis(first)
