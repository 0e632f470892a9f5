"""Records back from their JSON: the inverse of :func:`forensics.output.to_jsonable`.

Read at the edge, into records (``imports/imagemeta.py``'s rule, applied to our own artifacts): a
document another forensics command wrote (``analyze --json``, ``reproduce --json``, ``fleet --json``)
becomes the records that command wrote it from, checked against their annotations, and nothing past
this function sees a raw JSON value.  A value of the wrong type or form raises :class:`RecordFormatError`
naming where it is; keys a record does not have (values a payload adds, such as ``signature``) are
left out; a field the document lacks takes its default, and one without a default is an error.

Supported annotations: the records' own (``@record`` and frozen dataclasses), enums, ``int``, ``float``,
``str``, ``bool``, ``None``, ``X | None`` and other unions, ``tuple[X, ...]``, fixed tuples, ``list[X]``,
``dict[str, X]`` and ``Any``.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

__all__ = ["RecordFormatError", "from_jsonable", "load_document"]

_T = TypeVar("_T")
_HINTS: dict[type, dict[str, Any]] = {}


class RecordFormatError(ValueError):
    """A JSON value that is not what the record's annotation says (``where``: its path, ``$.crash.tid``)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def from_jsonable(tp: type[_T], value: object, where: str = "$") -> _T:
    """``value`` (parsed JSON) as an instance of ``tp``.

    >>> from forensics.model import SigInfo
    >>> from_jsonable(SigInfo, {"signo": 6, "code": -6, "errno": 0, "name": "SIGABRT", "extra": 1})
    SigInfo(signo=6, code=-6, errno=0, name='SIGABRT', addr=None, sender_pid=None, sender_uid=None)
    >>> from_jsonable(SigInfo, {"signo": "6", "code": 0, "errno": 0, "name": "x"})
    Traceback (most recent call last):
    ...
    forensics.jsonrecords.RecordFormatError: $.signo: expected int, found str
    """
    return typing.cast(_T, _decode(tp, value, where))


def load_document(doc: object, command: str, key: str, cls: type[_T]) -> _T:
    """The record ``cls`` under ``key`` of a ``forensics COMMAND --json`` document, after its ``command`` and
    ``schema_version`` (:data:`~forensics.output.SCHEMA_VERSION`) are checked.

    :raises ArtifactFormatError: another command's document, another or no schema version, a value of the
        wrong type or form (one line, naming where)
    """
    from .errors import ArtifactFormatError
    from .output import SCHEMA_VERSION

    if not isinstance(doc, dict):
        raise ArtifactFormatError(command, f"a JSON object is expected, found {_kind(doc)}")
    if doc.get("command") != command:
        raise ArtifactFormatError(command, f"its command is {doc.get('command')!r}")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactFormatError(command, "it has no schema_version" if version is None else
                                  f"its schema_version is {version!r}; this forensics reads {SCHEMA_VERSION}")
    try:
        return from_jsonable(cls, doc.get(key), f"$.{key}")
    except RecordFormatError as e:
        raise ArtifactFormatError(command, e.reason, e.where) from None


def _decode(tp: Any, value: object, where: str) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _union(typing.get_args(tp), value, where)
    if origin is tuple or origin is list:
        return _sequence(origin, typing.get_args(tp), value, where)
    if origin is dict:
        if not isinstance(value, dict):
            raise RecordFormatError(where, f"expected an object, found {_kind(value)}")
        _, vt = typing.get_args(tp)
        return {str(k): _decode(vt, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _record(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise RecordFormatError(where, f"{value!r} is not one of {', '.join(repr(m.value) for m in tp)}") from None
    return _scalar(tp, value, where)


def _union(args: tuple[Any, ...], value: object, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    last: RecordFormatError | None = None
    for a in args:
        if a is type(None):
            continue
        try:
            return _decode(a, value, where)
        except RecordFormatError as e:
            last = e
    raise last or RecordFormatError(where, f"unexpected {_kind(value)}")


def _sequence(origin: Any, args: tuple[Any, ...], value: object, where: str) -> Any:
    if not isinstance(value, list):
        raise RecordFormatError(where, f"expected an array, found {_kind(value)}")
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        items = [_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if len(value) != len(args):
        raise RecordFormatError(where, f"expected {len(args)} items, found {len(value)}")
    return tuple(_decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))


def _record(cls: type, value: object, where: str) -> Any:
    if not isinstance(value, dict):
        raise RecordFormatError(where, f"expected an object ({cls.__name__}), found {_kind(value)}")
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in value:
            kwargs[f.name] = _decode(hints[f.name], value[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordFormatError(f"{where}.{f.name}", "missing")
    return cls(**kwargs)


def _scalar(tp: Any, value: object, where: str) -> Any:
    if tp is type(None):
        if value is not None:
            raise RecordFormatError(where, f"expected null, found {_kind(value)}")
        return None
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
        return value
    name = getattr(tp, "__name__", str(tp))
    raise RecordFormatError(where, f"expected {name}, found {_kind(value)}")
