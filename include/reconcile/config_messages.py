"""Config messages: a sink file's validation errors as one line per problem, naming file and field.

Every problem is one :class:`~reconcile.errors.ConfigError` line naming the file and the field
(``schema[1].name``, ``upsert.key[0]``), and a file's problems are reported together
(:class:`ConfigErrors`): an unknown field with the nearest allowed name, a value outside a closed
set with the allowed values, a YAML 1.1 boolean (``off``, ``no``) or number where text belongs
with the advice to quote it.
"""

from __future__ import annotations

import functools
import re
from datetime import date, datetime
from typing import Any

import yaml
from pydantic import ValidationError

from reconcile.config import (
    KINDS,
    FieldError,
    SinkConfig,
    UpsertSpec,
    column_name_problems,
    did_you_mean,
    json_schema,
    schema_definition,
    upsert_problems,
)
from reconcile.errors import ConfigError, shorten


class ConfigErrors(ConfigError):
    """Every problem of one config file: ``problems`` holds one :class:`ConfigError` per field
    (``path``, ``field`` and ``sink`` are the first's); ``str()`` is their lines."""

    def __init__(self, problems: list[ConfigError]):
        assert problems, "a ConfigErrors without problems"
        first = problems[0]
        self.problems = list(problems)
        self.path, self.field, self.sink, self.remedy = first.path, first.field, first.sink, first.remedy
        Exception.__init__(self, "\n".join(str(p) for p in problems))


def problems_of(err: ConfigError) -> list[ConfigError]:
    """The one-line problems of a config error (one, or every problem of a file)."""
    return list(err.problems) if isinstance(err, ConfigErrors) else [err]


@functools.cache
def _schema() -> dict:
    """The JSON schema of a sink file, built once."""
    return json_schema()


_UNION_MEMBER = re.compile(r"^(str|int|bool|float|none|list\[.*\]|dict\[.*\]|[a-z-]+\[.*\])$")
_YAML_WORDS = {bool: "a boolean", int: "a number", float: "a number", date: "a date", datetime: "a date-time"}


def _clean(loc: tuple) -> tuple:
    """A pydantic location without its ``[key]`` and union member labels."""
    return tuple(p for p in loc if not (p == "[key]" or (isinstance(p, str) and _UNION_MEMBER.match(p))))


def _field(loc: tuple) -> str:
    """``('schema', 1, 'name')`` -> ``schema[1].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _allowed(kind: str | None, parent: tuple) -> list[str]:
    """The fields the JSON schema allows at ``parent`` of a ``kind`` sink (any kind's if None)."""
    schema = _schema()
    defs = schema["$defs"]
    if kind is None:
        return sorted({f for k in KINDS for f in defs[schema_definition(schema, k)]["properties"]})

    def resolve(node: dict) -> dict:
        while True:
            if "$ref" in node:
                node = defs[node["$ref"].rsplit("/", 1)[-1]]
            elif "anyOf" in node:
                node = next((m for m in node["anyOf"] if m.get("type") != "null"), {})
            else:
                return node

    node = resolve(defs[schema_definition(schema, kind)])
    for part in parent:
        if isinstance(part, int):
            node = resolve(node.get("items", {}))
        elif part in node.get("properties", {}):
            node = resolve(node["properties"][part])
        elif isinstance(node.get("additionalProperties"), dict):
            node = resolve(node["additionalProperties"])
        else:
            return []
    return list(node.get("properties", {}))


def _spelling(text: str | None, loc: tuple) -> str | None:
    """The scalar at ``loc`` as the YAML file spells it (``off`` for a boolean false)."""
    if text is None:
        return None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return None
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _message(err: Any, loc: tuple, kind: str | None, siblings: dict[tuple, list[str]], text: str | None) -> str:
    """One problem's message, saying what to write instead where the loader knows."""
    typ, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    cause = ctx.get("error")
    if typ == "missing":
        near = [f for f in siblings.get(loc[:-1], []) if did_you_mean(f, [loc[-1]])]
        return "is required" + (f" (the file has `{near[0]}`: misspelled?)" if near else "")
    if typ == "extra_forbidden":
        allowed = _allowed(kind, loc[:-1])
        other = [k for k in KINDS if k != kind and loc == (k,)]
        if other:
            return f"is the section of kind '{other[0]}'; this sink's kind is '{kind}' (a sink has one kind's section)"
        return (
            f"unknown field{did_you_mean(loc[-1], allowed)} (allowed here: {', '.join(allowed)}; "
            "`python -m reconcile schema` lists them all)"
        )
    if typ in ("string_type", "literal_error") and type(got) in _YAML_WORDS:
        as_written = _spelling(text, loc) or str(got)
        why = " (YAML 1.1 reads yes/no/on/off/true/false as booleans)" if isinstance(got, bool) else ""
        return f"YAML reads `{as_written}` as {_YAML_WORDS[type(got)]}, not text{why}: quote it, '{as_written}'"
    if typ == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if typ == "bool_type":
        return f"expected true or false, got {type(got).__name__} {got!r}"
    if typ == "literal_error":
        options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"{got!r} is not one of {', '.join(options)}{did_you_mean(got, options)}"
    if isinstance(cause, ValueError):
        return str(cause)
    return f"{err['msg']}, got {type(got).__name__} {got!r}"


def _kind_problem(tag: Any, data: dict, text: str | None) -> str:
    kinds = ", ".join(KINDS)
    got = data.get("kind")
    if tag["type"] == "union_tag_not_found":
        return f"is required ({kinds}: it picks the sink's section)"
    if isinstance(got, bool):
        as_written = _spelling(text, ("kind",)) or str(got)
        return f"YAML reads `{as_written}` as a boolean, not text: one of {kinds}"
    return f"{got!r} is not one of {kinds}{did_you_mean(got, KINDS)}"


def validation_problems(
    exc: ValidationError, data: dict, path: str, sink: str | None, text: str | None, context: dict
) -> list[ConfigError]:
    """Every problem of a file as one ConfigError each; one per field (a union's members, a
    list whose items failed: the innermost problem)."""
    errors = exc.errors()
    tag = next((e for e in errors if e["type"] in ("union_tag_not_found", "union_tag_invalid")), None)
    found: dict[str, str] = {}
    kind: str | None = str(data.get("kind"))
    if tag is None:
        located = [(_clean(tuple(e["loc"])[1:]), e) for e in errors]  # loc[0]: the kind the discriminator picked
    else:  # no kind to pick a model: the fields every kind has, and the unknown ones
        kind = None
        found["kind"] = _kind_problem(tag, data, text)
        allowed = _allowed(None, ())
        for key in data:
            if key not in allowed:
                found[str(key)] = f"unknown field{did_you_mean(key, allowed)} (allowed: {', '.join(allowed)})"
        common = [f.alias or name for name, f in SinkConfig.model_fields.items()]
        try:
            SinkConfig.model_validate({**{k: v for k, v in data.items() if k in common}, "kind": "-"}, context=context)
            located = []
        except ValidationError as inner:
            located = [(_clean(tuple(e["loc"])), e) for e in inner.errors()]
    siblings: dict[tuple, list[str]] = {}
    for loc, e in located:
        if e["type"] == "extra_forbidden":
            siblings.setdefault(loc[:-1], []).append(str(loc[-1]))
    for loc, e in located:
        if any(other[: len(loc)] == loc and len(other) > len(loc) for other, _ in located):
            continue  # a container whose items are reported
        if loc == ("as_of",) and e["type"] == "missing":
            continue  # it defaults to start_date, which is reported missing
        cause = (e.get("ctx") or {}).get("error")
        pairs = (
            cause.problems if isinstance(cause, FieldError) else [(_field(loc), _message(e, loc, kind, siblings, text))]
        )
        for fld, message in pairs:
            found.setdefault(fld, shorten(message, 400))  # one line; a long value cut in its middle
    for fld, message in _raw_problems(data):  # checks that other fields' problems kept from running
        found.setdefault(fld, message)
    return [ConfigError(path, fld, message, sink=sink) for fld, message in found.items()]


def _raw_problems(data: dict) -> list[tuple[str, str]]:
    """The checks across fields, on the file's own values: a model runs them only when every
    field is valid, and a file's problems are reported together."""
    raw = data.get("schema")
    names = [c.get("name") for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []
    problems = column_name_problems(names)
    if data.get("kind") == "upsert" and names:
        try:
            spec = UpsertSpec.model_validate(data.get("upsert"), context={"base": "."})
        except ValidationError:
            return problems
        problems += upsert_problems([n for n in names if isinstance(n, str)], spec)
    return problems
