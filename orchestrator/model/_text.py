"""What the store can hold: Unicode text without NUL, and data that JSON gives back as it was.

`text_problem` says why one string cannot be stored; `first_unstorable` finds the first value
inside a result or a request body that cannot, and where (`rows[2].name`); `storable` turns
any text (an error message, a reason) into text that can be stored, escaping what cannot.
A lone surrogate (`"\\udcff"`, which `json.loads` accepts and aiohttp makes of non-UTF-8
header bytes) is not Unicode text: UTF-8, and so every encoder and database, refuses it.
PostgreSQL's text cannot hold NUL; it is refused on every store alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

_NUL = "\x00"


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored, or None."""
    if text.isascii():
        return None if _NUL not in text else _nul(text)
    if _NUL in text:
        return _nul(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"it holds a lone surrogate ({ascii(text[exc.start])[1:-1]}) at character "
            f"{exc.start}, which is not Unicode text; send text as UTF-8"
        )
    return None


def _nul(text: str) -> str:
    return (
        f"it holds a NUL character (\\u0000) at character {text.index(_NUL)}, which the store "
        "cannot hold; remove it"
    )


def storable(text: str) -> str:
    """`text` itself if it can be stored, else with each lone surrogate and NUL written as
    its escape (`\\udcff`, `\\x00`): for messages, which must be recorded whatever they say."""
    if text_problem(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace(_NUL, "\\x00")


def key_text(key: object) -> str:
    """A key as it can be shown in a path (escaped when it could not be stored)."""
    text = key if isinstance(key, str) else repr(key)
    return text if text_problem(text) is None else ascii(text)[1:-1]


def join_path(path: str, key: object) -> str:
    """`path` and one more step: `[2]` for an index, `.name` for a key."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    shown = key_text(key)
    return f"{path}.{shown}" if path else shown


MAX_NESTING = 64
"""How deeply a stored value may nest lists and dicts: well under what the log's JSON encoder
(pydantic, about 250 levels) and its reader (about 200) take, with room for the event around it."""


_NO_KEY = object()
_Children = list[tuple[Any, str, int, object]]


def first_unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first place in `value` the store cannot hold exactly, and why; None if it can.

    Held: str (no lone surrogate, no NUL), int, bool, None, finite floats, lists, tuples
    (they come back as lists), dicts with str keys, and dataclasses and pydantic models
    (stored as their fields, as pydantic writes them), nested at most `MAX_NESTING` deep.
    Refused: NaN and infinities, bytes, sets, keys that are not str, deeper nesting, and
    every other type. The walk keeps its own stack, so no depth makes it fail itself."""
    # Each entry: a value, its path, how deeply it is nested, and the key it is held under
    # (checked before the value, so places are found in the order they are written).
    stack: _Children = [(value, path, 0, _NO_KEY)]
    while stack:
        item, here, depth, key = stack.pop()
        if key is not _NO_KEY and (found := _key_problem(key, here)) is not None:
            return found
        found, children = _look(item, here, depth)
        if found is not None:
            return found
        stack.extend(reversed(children))
    return None


def _key_problem(key: object, here: str) -> tuple[str, str] | None:
    if not isinstance(key, str):
        return here, (
            f"its key {key!r} is a {type(key).__name__}; JSON keys are strings and it "
            "would come back as one: use str keys"
        )
    if (problem := text_problem(key)) is not None:
        return here, f"its key: {problem}"
    return None


def _look(value: Any, path: str, depth: int) -> tuple[tuple[str, str] | None, _Children]:
    """What is wrong with `value` itself, and the values inside it still to look at."""
    if value is None or isinstance(value, bool | int):
        return None, []
    where = path or "(value)"
    if isinstance(value, str):
        problem = text_problem(value)
        return (None if problem is None else (where, problem)), []
    if isinstance(value, float):
        if math.isfinite(value):
            return None, []
        return (where, f"it is {value!r}, which JSON cannot hold; use None or a string"), []
    nests = isinstance(value, list | tuple | Mapping) or dataclasses.is_dataclass(value)
    if nests and depth >= MAX_NESTING:
        return (where, _too_deep()), []
    if isinstance(value, list | tuple):
        return None, [(item, f"{path}[{i}]", depth + 1, _NO_KEY) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        if not isinstance(value, dict):
            return (where, _not_json(value)), []
        return None, [(v, join_path(path, k), depth + 1, k) for k, v in value.items()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
        return None, [(v, join_path(path, k), depth + 1, k) for k, v in fields]
    dump = getattr(value, "model_dump", None)
    if dump is not None and hasattr(type(value), "__pydantic_fields__"):
        try:
            fields = dump(mode="json")
        except (ValueError, RecursionError) as exc:  # pydantic's errors are ValueErrors
            if "depth" in str(exc) or isinstance(exc, RecursionError):
                return (where, _too_deep()), []
            return (where, f"pydantic cannot write it as JSON: {storable(str(exc))}"), []
        return None, [(fields, path, depth, _NO_KEY)]
    return (where, _not_json(value)), []


def _too_deep() -> str:
    return (
        f"it is nested more than {MAX_NESTING} levels deep (lists and dicts inside each "
        "other), which the store does not hold; return flatter data"
    )


def _not_json(value: object) -> str:
    name = type(value).__name__
    if isinstance(value, bytes | bytearray | memoryview):
        hint = "decode it to str (or base64-encode it)"
    elif isinstance(value, set | frozenset):
        hint = "return a list of it (sorted(...))"
    else:
        hint = "return plain data (str, numbers, lists, dicts) made from it"
    return f"it is a {name}, which JSON has no type for; {hint}"


def scrubbed(value: Any) -> Any:
    """`value` as JSON data the store can hold, whatever it holds: text made `storable`,
    NaN and infinities as None, tuples and sets as lists, dataclasses, pydantic models and
    mappings as dicts with str keys, anything else as its repr, and whatever lies deeper than
    `MAX_NESTING` as a note saying so. The last resort for a record that must be written and
    could not be encoded as it was: the log reads it back."""
    return _scrub(value, 0)


_TOO_DEEP = f"(nested more than {MAX_NESTING} levels deep: not stored)"


def _scrub(value: Any, depth: int) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= MAX_NESTING:
        return _TOO_DEEP
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(item, depth + 1) for item in value]
    if isinstance(value, Mapping):
        return {key_text(k): _scrub(v, depth + 1) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _scrub(fields, depth)
    if hasattr(type(value), "__pydantic_fields__"):
        # Field by field (not `model_dump`, which fails on what is nested too deeply).
        fields = {name: getattr(value, name) for name in type(value).__pydantic_fields__}
        return _scrub(fields, depth)
    try:
        return storable(repr(value)[:1000])
    except RecursionError:
        return f"(a {type(value).__name__} that cannot be shown)"
