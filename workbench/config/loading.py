"""TOML reading and writing, and the located errors every loader raises."""

from __future__ import annotations

import copy
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions
from pydantic import BaseModel, Tag, ValidationError


class ConfigProblem(BaseModel):
    """One thing wrong with a config file."""

    key: str
    message: str
    line: int | None = None

    def render(self, path: Path | str | None) -> str:
        where = str(path) if path else "<config>"
        if self.line is not None:
            where += f", line {self.line}"
        key = f" {self.key}:" if self.key else ""
        return f"{where}:{key} {self.message}"


class ConfigError(ValueError):
    """A config file (or text) is invalid; `str()` lists every problem once, one per line
    (the runs that share a `[defaults]` key share its problem)."""

    def __init__(self, path: Path | str | None, problems: list[ConfigProblem]):
        self.path = path
        self.problems = _dedupe(problems)
        super().__init__("\n".join(p.render(path) for p in self.problems))


def parse_toml(text: str, path: Path | str | None = None) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as err:
        message = str(err).split(" at line ")[0]
        raise ConfigError(
            path, [ConfigProblem(key="", message=f"not valid TOML: {message}", line=err.line)]
        ) from None
    except tomlkit.exceptions.KeyAlreadyPresent as err:
        # tomlkit's error for a key written twice in a [[runs]] table after the first: no line
        message = f"not valid TOML: {err} (a key is written twice in one table; keep one)"
        raise ConfigError(
            path, [ConfigProblem(key="", message=message, line=_repeated_key_line(text))]
        ) from None


def read_toml(path: Path) -> tuple[tomlkit.TOMLDocument, str]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            path, [ConfigProblem(key="", message="file not found; check the path")]
        ) from None
    except (IsADirectoryError, UnicodeDecodeError) as err:
        raise ConfigError(path, [ConfigProblem(key="", message=f"cannot read: {err}")]) from None
    return parse_toml(text, path), text


def model_to_toml(model: BaseModel, header: str | None = None) -> str:
    """Render a config model as TOML; None values are left out (TOML has no null)."""
    document = tomlkit.document()
    if header:
        for line in header.splitlines():
            document.add(tomlkit.comment(line))
        document.add(tomlkit.nl())
    for key, value in _drop_none(model.model_dump(mode="json")).items():
        document[key] = value
    return tomlkit.dumps(document)


def load_partial(model_cls: type[BaseModel], path: Path) -> dict[str, Any]:
    """The table of a file holding some of `model_cls`'s keys, the rest coming from
    elsewhere (`runs add --from`). Unknown keys and bad values are reported with this file
    and their line; missing keys and rules across keys wait for the merged config."""
    document, text = read_toml(path)
    data = document.unwrap()
    try:
        model_cls.model_validate(data)
    except ValidationError as err:
        problems = [
            located_problem(item, model_cls, (), text)
            for item in err.errors()
            if item["loc"] and item["type"] != "missing"
        ]
        if problems:
            raise ConfigError(path, problems) from None
    return data


def validate_model(
    model_cls: type[BaseModel], data: dict[str, Any], path: Path | str | None, text: str
) -> Any:
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(path, problems_from_validation(err, model_cls, text)) from None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `override` applied; nested tables merge key by key."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_assignment(assignment: str) -> tuple[str, Any]:
    """`lr=1e-3` or `sampling.temperature=0.7` -> (dotted key, TOML-typed value).

    Values are parsed as TOML, so `1e-3` is a float and `true` a bool; anything that is
    not valid TOML is taken as a plain string (`env=reverse_text`).
    """
    key, sep, value = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {assignment!r}")
    try:
        parsed = tomlkit.parse(f"v = {value.strip()}")["v"]
        return key, parsed.unwrap() if hasattr(parsed, "unwrap") else parsed
    except tomlkit.exceptions.ParseError:
        return key, value.strip()


def nest_dotted(key: str, value: Any) -> dict[str, Any]:
    """`("sampling.temperature", 0.7)` -> `{"sampling": {"temperature": 0.7}}`."""
    result: dict[str, Any] = {}
    node = result
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return result


def problems_from_validation(
    err: ValidationError, model_cls: type[BaseModel], text: str, prefix: tuple = ()
) -> list[ConfigProblem]:
    """Every error of a failed validation as a problem at its key and line."""
    return [located_problem(item, model_cls, prefix, text) for item in err.errors()]


def located_problem(
    item: dict[str, Any], model_cls: type[BaseModel], prefix: tuple, text: str | None
) -> ConfigProblem:
    """One pydantic error of `model_cls` as a problem at its key (`prefix` before it)."""
    loc = tuple(item["loc"])
    message = explain_error(item, model_cls, loc)
    return problem_at((*prefix, *config_loc(model_cls, loc)), message, text)


def config_loc(model_cls: type[BaseModel], loc: tuple) -> tuple:
    """A pydantic error's location as the file spells it: pydantic puts the tag of a
    tagged union's member in it (`loss.ppo.eps_high`), which no file has a key for."""
    return _place(model_cls, loc).loc


def explain_error(item: dict[str, Any], model_cls: type[BaseModel], loc: tuple) -> str:
    """What one pydantic error means, in the words of every config error. `loc` is the
    error's location in `model_cls` as pydantic gives it (tags of tagged unions in it)."""
    kind = item["type"]
    if kind == "extra_forbidden":
        return _unknown_key(_place(model_cls, loc[:-1]), str(loc[-1]))
    if kind == "missing":
        if loc == ("model", "base") or loc == ("model",):
            return 'missing base model: add [model] with base = "builtin:tiny-reverse" (or a path)'
        return "required key is missing"
    got = item.get("input")
    shown = repr(got) if not isinstance(got, dict) else "a table"
    message = item["msg"]
    if kind == "finite_number":
        return f"must be a finite number (got {shown}): inf and nan are no setting's value"
    if message.startswith("Value error, "):
        return message.removeprefix("Value error, ")
    return f"{message} (got {shown})"


@dataclass
class _Place:
    """Where a location leads: its keys as the file spells them, the table there, and, when
    that table is one kind of a tagged union (`loss`, `[sweep.scheduler]`), every kind."""

    loc: tuple
    model: type[BaseModel] | None
    kinds: dict[str, type[BaseModel]] = field(default_factory=dict)
    tag: str | None = None


def _place(model_cls: type[BaseModel], loc: tuple) -> _Place:
    place = _Place(loc=(), model=model_cls)
    members: dict[str, type[BaseModel]] = {}
    for part in loc:
        if isinstance(part, str) and part in members:  # a tag pydantic put in the location
            place.model, place.kinds, place.tag = members[part], members, part
            members = {}
            continue
        place.loc += (part,)
        if isinstance(part, int) or place.model is None:
            continue
        info = place.model.model_fields.get(part)
        place.kinds, place.tag = {}, None
        members = tagged_members(info.annotation) if info is not None else {}
        inner = _optional_inner(info.annotation) if info is not None else None
        is_model = isinstance(inner, type) and issubclass(inner, BaseModel)
        place.model = inner if is_model else None
    return place


def tagged_members(annotation: Any) -> dict[str, type[BaseModel]]:
    """The kinds of a tagged union (`Annotated[A, Tag("a")] | ...`) by tag; {} otherwise."""
    members: dict[str, type[BaseModel]] = {}
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Annotated:
            base, *extras = typing.get_args(arg)
            tags = [extra.tag for extra in extras if isinstance(extra, Tag)]
            if tags and isinstance(base, type) and issubclass(base, BaseModel):
                members[tags[0]] = base
                continue
        members.update(tagged_members(arg))
    return members


def _unknown_key(place: _Place, key: str) -> str:
    """A key the table at `place` does not take: of another kind of it (which ones, and
    the keys this kind takes), else a typo (the closest key, and every one allowed)."""
    allowed = sorted(place.model.model_fields) if place.model is not None else []
    owners = [tag for tag, model in place.kinds.items() if key in model.model_fields]
    if owners and place.model is not None:
        table = _render_loc(place.loc)
        shared = set.intersection(*(set(model.model_fields) for model in place.kinds.values()))
        fields = [name for name in place.model.model_fields if name != "kind"]
        takes = sorted(fields, key=lambda name: name in shared)  # its own keys first
        return (
            f"{table}.{key} belongs to {table}.kind {' / '.join(owners)}, not {place.tag!r}, "
            f"which takes {', '.join(f'{table}.{name}' for name in takes)}"
        )
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (allowed here: {', '.join(allowed)})"


def _optional_inner(annotation: Any) -> Any:
    """`X | None` -> X, so the keys of an optional table are listed too."""
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if isinstance(annotation, types.UnionType) and len(members) == 1:
        return members[0]
    return annotation


def problem_at(loc: tuple, message: str, text: str | None) -> ConfigProblem:
    """A problem at a key of a TOML text (its line found in `text`)."""
    return ConfigProblem(key=_render_loc(loc), message=message, line=_line_of(loc, text))


def _render_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _dedupe(problems: list[ConfigProblem]) -> list[ConfigProblem]:
    seen = set()
    unique = []
    for problem in problems:
        marker = (problem.key, problem.message)
        if marker not in seen:
            seen.add(marker)
            unique.append(problem)
    return unique


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


_TABLE = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


_ARRAY_TABLE = re.compile(r"^\s*\[\[\s*([^\[\]]+?)\s*\]\]\s*(#.*)?$")


_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)


def _split_key(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in dotted.split("."))


def _key_lines(text: str) -> dict[tuple, int]:
    """Map every table header and key of a TOML text to its 1-based line.

    tomlkit keeps no line numbers for parsed keys, so this small scanner recovers them:
    `[a.b]` -> ("a", "b"), the n-th `[[runs]]` -> ("runs", n), `x = 1` under it ->
    ("runs", n, "x"). Good enough to point a user at the right line.
    """
    lines: dict[tuple, int] = {}
    table: tuple = ()
    array_counts: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if match := _ARRAY_TABLE.match(line):
            name = _split_key(match.group(1))
            index = array_counts.get(name, -1) + 1
            array_counts[name] = index
            table = (*name, index)
            lines.setdefault(table, number)
        elif match := _TABLE.match(line):
            table = _split_key(match.group(1))
            lines.setdefault(table, number)
        elif match := _KEY.match(line):
            lines.setdefault((*table, *_split_key(match.group(1))), number)
    return lines


def _repeated_key_line(text: str) -> int | None:
    """The line of the first key written a second time in the same table, if any."""
    seen: set[tuple[int, tuple[str, ...]]] = set()
    table = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if _ARRAY_TABLE.match(line) or _TABLE.match(line):
            table += 1  # every header opens a table of its own
        elif match := _KEY.match(line):
            marker = (table, _split_key(match.group(1)))
            if marker in seen:
                return number
            seen.add(marker)
    return None


def _line_of(loc: tuple, text: str | None) -> int | None:
    if not text:
        return None
    lines = _key_lines(text)
    # Pydantic locations may go deeper than the source (inline tables, list items):
    # fall back to the longest prefix that the file spells out.
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None
