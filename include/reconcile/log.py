"""One-line structured log events: every line carries the whole state (sink, frontiers, batch).

``event(log, "appended batch", sink=..., lower=..., upper=...)`` logs
``appended batch | sink=orders lower=10 upper=20``: an on-call engineer reads one line and knows
where the shard stands; the same fields go to ``extra`` for structured handlers.
"""

from __future__ import annotations

import logging
from typing import Any


def fmt(message: str, **state: Any) -> str:
    fields = " ".join(f"{k}={v}" for k, v in state.items() if v is not None)
    return f"{message} | {fields}" if fields else message


def event(logger: logging.Logger, message: str, **state: Any) -> str:
    """Log ``message`` with the state at ``level`` (a keyword among the state; default INFO)."""
    level = int(state.pop("level", logging.INFO))
    line = fmt(message, **state)
    logger.log(level, line, extra={"reconcile": state})
    return line
