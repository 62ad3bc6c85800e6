"""One-line structured log events: every line carries the whole state (sink, frontiers, batch).

``event(log, "appended batch", sink=..., lower=..., upper=...)`` logs
``appended batch | sink=orders lower=10 upper=20``: an on-call engineer reads one line and knows
where the shard stands; the same fields go to ``extra`` for structured handlers.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

# Fields that hold times (epoch ms): printed as ISO UTC with the ms value beside it.
TIME_FIELDS = frozenset({"lower", "upper", "since", "as_of", "shard_upper", "old_upper", "frontier", "new_since"})


def iso(ms: int | None) -> str:
    """``2026-11-24T09:00:00.000Z (1795510800000)``: a time (epoch ms) as every output shows it."""
    if ms is None:
        return "-"
    try:
        text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return f"{text} ({ms})"


def _field(key: str, value: Any) -> str:
    if key in TIME_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return f"{key}={iso(value)}"
    return f"{key}={value}"


def fmt(message: str, **state: Any) -> str:
    fields = " ".join(_field(k, v) for k, v in state.items() if v is not None)
    return f"{message} | {fields}" if fields else message


def event(logger: logging.Logger, message: str, **state: Any) -> str:
    """Log ``message`` with the state at ``level`` (a keyword among the state; default INFO)."""
    level = int(state.pop("level", logging.INFO))
    line = fmt(message, **state)
    logger.log(level, line, extra={"reconcile": state})
    return line
