"""Named fail points in the write and append paths (as Materialize's ``fail_point!``).

Off by default and free when off: ``failpoint(name)`` is a dict lookup on an empty dict.
Armed through the environment, ``RECONCILE_FAILPOINTS="append.after_delta_commit=kill,..."``
(read at import, so a subprocess inherits it), or in-process with :func:`arm`. Actions:

- ``raise``: raise :class:`~reconcile.errors.FailPointHit` (a retryable error);
- ``kill``: end the process at once with SIGKILL semantics (``os._exit(137)``): no cleanup,
  no ``finally`` blocks, exactly like a lost machine;
- ``sleep:<seconds>``: pause there, then go on (a stalled writer: a paused process, a slow
  network);
- ``<action>@<n>``: act only on the n-th hit (1-based), pass otherwise.

Points (docs/design.md says what each proves): write.after_partition_staged, write.after_staged, append.after_advance_as_of,
append.before_delta_commit, append.inside_delta_commit, append.inside_lease, append.after_delta_commit,
metadata.inside_absorb, compact.after_since, compact.after_commit, current.before_commit,
current.after_commit.
"""

from __future__ import annotations

import os
import time

from reconcile.errors import FailPointHit

POINTS = (
    "write.after_partition_staged",
    "write.after_staged",
    "append.after_advance_as_of",
    "append.before_delta_commit",
    "append.inside_delta_commit",
    "append.inside_lease",
    "append.after_delta_commit",
    "metadata.inside_absorb",
    "compact.after_since",
    "compact.after_commit",
    "current.before_commit",
    "current.after_commit",
)

_armed: dict[str, str] = {}
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        if name not in POINTS:
            raise ValueError(f"RECONCILE_FAILPOINTS: unknown fail point {name!r}; known: {POINTS}")
        out[name] = action or "raise"
    return out


def arm(name: str, action: str = "raise") -> None:
    _armed.update(_parse(f"{name}={action}"))
    _hits.pop(name, None)


def disarm_all() -> None:
    _armed.clear()
    _hits.clear()


def failpoint(name: str) -> None:
    if not _armed:
        return
    action = _armed.get(name)
    if action is None:
        return
    action, _, nth = action.partition("@")
    _hits[name] = _hits.get(name, 0) + 1
    if nth and _hits[name] != int(nth):
        return
    if action == "kill":
        os._exit(137)
    if action.startswith("sleep:"):
        time.sleep(float(action.removeprefix("sleep:")))
        return
    raise FailPointHit(f"fail point {name} hit (armed for a test)")


_armed.update(_parse(os.environ.get("RECONCILE_FAILPOINTS", "")))
