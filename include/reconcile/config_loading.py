"""Config loading: a sink's YAML file, or the sinks folder, read and validated into its model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from reconcile.config import SINK_ADAPTER, SINK_NAME_RE, SinkConfig
from reconcile.config_messages import ConfigErrors, validation_problems
from reconcile.errors import ConfigError


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


def load_file(path: Path | str) -> SinkConfig:
    path = Path(path)
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise ConfigError(str(path), "<file>", "does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), "<file>", f"is not valid YAML: {' '.join(str(exc).split())}") from None
    return parse(data, str(path), default_name=path.stem, text=text)


def load_dir(directory: Path | str | None = None) -> tuple[list[SinkConfig], list[ConfigError]]:
    """All sink configs of a folder: (valid configs, errors of the invalid files)."""
    from reconcile import settings

    directory = Path(directory) if directory else settings.sinks_dir()
    configs: list[SinkConfig] = []
    errors: list[ConfigError] = []
    names: dict[str, str] = {}
    for path in sorted(directory.glob("*.y*ml")):
        try:
            cfg = load_file(path)
        except ConfigError as exc:
            errors.append(exc)
            continue
        if cfg.name in names:
            errors.append(ConfigError(str(path), "name", f"sink {cfg.name!r} is also defined in {names[cfg.name]}"))
            continue
        names[cfg.name] = str(path)
        configs.append(cfg)
    return configs, errors


def load_sink(name: str, directory: Path | str | None = None) -> SinkConfig:
    configs, errors = load_dir(directory)
    for cfg in configs:
        if cfg.name == name:
            return cfg
    for err in errors:
        if Path(err.path).stem == name:
            raise err
    raise ConfigError(str(directory or "RECONCILE_SINKS_DIR"), "name", f"no sink named {name!r}")
