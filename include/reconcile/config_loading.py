"""Config loading: a sink's YAML file, or the sinks folder, read and validated into its model.

Cheap at any fleet size: YAML is parsed by libyaml (PyYAML's C loader) where it is installed,
and a process validates a file once (:func:`load_file` keeps each valid config by path,
modification time and size, and the environment its ``${VAR}`` refer to: a changed file is read
again). A sink is found by the file named after it (:func:`load_sink`: one file read, not the
folder), which is also the file that defines the sink when two files name it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from reconcile.config import SINK_ADAPTER, SINK_NAME_RE, SinkConfig
from reconcile.config_messages import ConfigErrors, validation_problems
from reconcile.errors import ConfigError

# libyaml's loader where PyYAML was built with it (the wheels are), else the pure-Python one:
# the same documents, about ten times faster.
SafeLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
# A file modified this close to when it was cached may have changed again within the file
# system's timestamp granularity: its text is compared too (git's "racy clean" rule).
RACY_NS = 2_000_000_000


@dataclass(frozen=True)
class _Valid:
    """A valid sink file as this process validated it: the stat it had, the environment its
    ``${VAR}`` saw, its text and its config."""

    given: str  # the path as given (the config's ``path``)
    mtime_ns: int
    size: int
    environment: tuple
    cached_ns: int
    text: str
    cfg: SinkConfig


_VALID: dict[str, _Valid] = {}  # by absolute path


def parse(data: Any, path: str, default_name: str | None = None, text: str | None = None) -> SinkConfig:
    """Validate one config mapping. ``path`` names the file in messages; ``text`` (the file as
    written) lets a message quote a value as the file spells it."""
    if not isinstance(data, dict):
        raise ConfigError(path, "<root>", "expected a mapping")
    problems = []
    if "name" not in data:
        if SINK_NAME_RE.match(default_name or ""):
            data = {**data, "name": default_name}
        else:
            why = f"file stem {default_name!r} is not a valid sink name; set 'name'"
            problems.append(ConfigError(path, "name", why))
    sink = data["name"] if isinstance(data.get("name"), str) and SINK_NAME_RE.match(data["name"]) else None
    context = {"path": path, "base": str(Path(path).resolve().parent)}
    try:
        cfg = SINK_ADAPTER.validate_python(data, context=context)
    except ValidationError as exc:
        seen = {p.field for p in problems}
        problems += [p for p in validation_problems(exc, data, path, sink, text, context) if p.field not in seen]
    else:
        if not problems:
            return cfg
    raise ConfigErrors(problems)


def _environment(names: tuple[str, ...]) -> tuple:
    """What the ``${VAR}`` a file names expand to now (``RECONCILE_HOME``: its default too)."""
    from reconcile import settings

    return tuple((n, str(settings.home()) if n == "RECONCILE_HOME" else os.environ.get(n)) for n in names)


def load_file(path: Path | str) -> SinkConfig:
    """One sink file, validated. A file this process validated before is not parsed nor
    validated again while its path, modification time (ns) and size are unchanged and so is what
    its ``${VAR}`` expand to (a file modified within :data:`RACY_NS` of that: its text too)."""
    path = Path(path)
    key = os.path.abspath(path)
    try:
        st = os.stat(path)
        hit = _VALID.get(key)
        if hit is not None and _unchanged(hit, str(path), st):
            return hit.cfg
        text = path.read_text()
        if hit is not None and _unchanged(hit, str(path), st, text):
            _VALID[key] = replace(hit, cached_ns=time.time_ns())  # its stat is enough once no longer racy
            return hit.cfg
        data = yaml.load(text, Loader=SafeLoader)  # noqa: S506 - a safe loader (libyaml's, else PyYAML's)
    except FileNotFoundError:
        raise ConfigError(str(path), "<file>", "does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "<file>", f"is not valid YAML: {' '.join(str(exc).split())}") from None
    cfg = parse(data, str(path), default_name=path.stem, text=text)
    names = tuple(sorted({a or b for a, b in _VAR.findall(text)}))
    _VALID[key] = _Valid(str(path), st.st_mtime_ns, st.st_size, _environment(names), time.time_ns(), text, cfg)
    return cfg


def _unchanged(hit: _Valid, given: str, st: os.stat_result, text: str | None = None) -> bool:
    """Is the file ``hit`` cached still what it was (``text``: its text read now, for a file
    modified too close to when it was cached to trust its stat alone)?"""
    same = (hit.given, hit.mtime_ns, hit.size) == (given, st.st_mtime_ns, st.st_size)
    if not same or _environment(tuple(n for n, _ in hit.environment)) != hit.environment:
        return False
    if hit.cached_ns - st.st_mtime_ns > RACY_NS:
        return True
    return text is not None and text == hit.text


def sink_files(directory: Path | str | None = None) -> list[Path]:
    """The sink files of a folder (default: ``RECONCILE_SINKS_DIR``), in name order."""
    from reconcile import settings

    directory = Path(directory) if directory else settings.sinks_dir()
    return sorted(directory.glob("*.y*ml"))


def load_dir(directory: Path | str | None = None) -> tuple[list[SinkConfig], list[ConfigError]]:
    """All sink configs of a folder: (valid configs, errors of the invalid files). A sink name
    defined by two files is the one of the file named after it (else of the first file in name
    order); each other file defining it is an error."""
    loaded: list[tuple[Path, SinkConfig | ConfigError]] = []
    for path in sink_files(directory):
        try:
            loaded.append((path, load_file(path)))
        except ConfigError as exc:
            loaded.append((path, exc))
    owner: dict[str, Path] = {}
    for path, got in loaded:
        if isinstance(got, SinkConfig) and (got.name not in owner or path.stem == got.name != owner[got.name].stem):
            owner[got.name] = path
    configs: list[SinkConfig] = []
    errors: list[ConfigError] = []
    for path, got in loaded:
        if isinstance(got, ConfigError):
            errors.append(got)
        elif owner[got.name] != path:
            errors.append(ConfigError(str(path), "name", f"sink {got.name!r} is also defined in {owner[got.name]}"))
        else:
            configs.append(got)
    return configs, errors


def named_file(name: str, directory: Path | str | None = None) -> Path | None:
    """The sink file named after sink ``name`` (``<name>.yaml``, else ``<name>.yml``), if any."""
    from reconcile import settings

    folder = Path(directory) if directory else settings.sinks_dir()
    for suffix in (".yaml", ".yml"):
        if (folder / f"{name}{suffix}").is_file():
            return folder / f"{name}{suffix}"
    return None


def load_named(name: str, directory: Path | str | None = None) -> SinkConfig | None:
    """Sink ``name`` from the one file named after it, when that file defines it (then it is the
    sink whatever other files say, :func:`load_dir`); None otherwise (it may be defined in a
    file of another name, or be invalid: ask :func:`load_sink`)."""
    path = named_file(name, directory) if SINK_NAME_RE.match(name) else None
    if path is None:
        return None
    try:
        cfg = load_file(path)
    except ConfigError:
        return None
    return cfg if cfg.name == name else None


def load_sink(name: str, directory: Path | str | None = None) -> SinkConfig:
    """Sink ``name``: from the file named after it (one file read), else found in the folder."""
    cfg = load_named(name, directory)
    if cfg is not None:
        return cfg
    configs, errors = load_dir(directory)
    for cfg in configs:
        if cfg.name == name:
            return cfg
    for err in errors:
        if Path(err.path).stem == name:
            raise err
    raise ConfigError(str(directory or "RECONCILE_SINKS_DIR"), "name", f"no sink named {name!r}")
