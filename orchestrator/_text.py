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


def first_unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first place in `value` the store cannot hold exactly, and why; None if it can.

    Held: str (no lone surrogate, no NUL), int, bool, None, finite floats, lists, tuples
    (they come back as lists), dicts with str keys, and dataclasses and pydantic models
    (stored as their fields, as pydantic writes them). Refused: NaN and infinities, bytes,
    sets, keys that are not str, and every other type. A result nested too deeply to walk is
    refused too."""
    try:
        return _walk(value, path)
    except RecursionError:
        return path or "(value)", "it is nested too deeply to be stored"


def _walk(value: Any, path: str) -> tuple[str, str] | None:
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else (path or "(value)", problem)
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return path or "(value)", f"it is {value!r}, which JSON cannot hold; use None or a string"
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := _walk(item, f"{path}[{i}]")) is not None:
                return found
        return None
    if isinstance(value, Mapping):
        return _walk_mapping(value, path, exact=isinstance(value, dict))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _walk_mapping(fields, path, exact=True)
    dump = getattr(value, "model_dump", None)
    if dump is not None and hasattr(type(value), "__pydantic_fields__"):
        try:
            fields = dump(mode="json")
        except ValueError as exc:  # pydantic's serialization errors are ValueErrors
            return path or "(value)", f"pydantic cannot write it as JSON: {storable(str(exc))}"
        return _walk(fields, path)
    return path or "(value)", _not_json(value)


def _walk_mapping(value: Mapping[Any, Any], path: str, *, exact: bool) -> tuple[str, str] | None:
    if not exact:
        return path or "(value)", _not_json(value)
    for key, item in value.items():
        here = join_path(path, key)
        if not isinstance(key, str):
            return here, (
                f"its key {key!r} is a {type(key).__name__}; JSON keys are strings and it "
                "would come back as one: use str keys"
            )
        if (problem := text_problem(key)) is not None:
            return here, f"its key: {problem}"
        if (found := _walk(item, here)) is not None:
            return found
    return None


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
    mappings as dicts with str keys, anything else as its repr. The last resort for a record
    that must be written and could not be encoded as it was."""
    try:
        return _scrub(value)
    except RecursionError:
        return "(nested too deeply to be stored)"


def _scrub(value: Any) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(item) for item in value]
    if isinstance(value, Mapping):
        return {key_text(k): _scrub(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _scrub(getattr(value, f.name)) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if dump is not None and hasattr(type(value), "__pydantic_fields__"):
        try:
            return _scrub(dump(mode="python"))
        except ValueError:
            pass
    return storable(repr(value))
