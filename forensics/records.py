"""``@record``: a frozen, slotted, keyword-only record class, as ``@dataclass(frozen=True, slots=True,
kw_only=True)`` makes one, defined without compiling code.

``dataclasses`` writes each record's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and ``exec``-s it when the class is defined,
every time the module is imported: about a millisecond a record, 30 ms for :mod:`forensics.model`
alone, most of what ``forensics analyze`` spent before reading the core.  ``@record`` gives the
class the same behaviour with methods shared by every record (they read the field names from the
class) and rebuilds the class once with ``__slots__``, as ``dataclass(slots=True)`` does.

It stays a dataclass to the rest of the world: ``__dataclass_fields__`` holds real
:class:`dataclasses.Field` objects, so :func:`dataclasses.fields`, :func:`~dataclasses.asdict`,
:func:`~dataclasses.replace` and :func:`~dataclasses.is_dataclass` work on it; instances compare
and hash by their fields, refuse assignment with :class:`dataclasses.FrozenInstanceError`, and
pickle (a batch's workers send analyses back).  Supported: annotated fields with plain defaults or
``field(default_factory=...)``; no ``__post_init__``, ``InitVar`` or ``ClassVar``, no inheritance
between records (none of ours needs them).

>>> @record
... class Point:
...     x: int
...     y: int = 0
>>> p = Point(x=1)
>>> p, p == Point(x=1, y=0), hash(p) == hash(Point(x=1))
(Point(x=1, y=0), True, True)
>>> import dataclasses
>>> [f.name for f in dataclasses.fields(p)], dataclasses.replace(p, y=2)
(['x', 'y'], Point(x=1, y=2))
"""
from __future__ import annotations

import dataclasses

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from typing import Any, TypeVar

    # PEP 681: tells a type checker that @record makes a dataclass-like class, frozen and keyword-only.
    # typing has it from 3.11 only; the type checker reads it from typing_extensions' stubs.
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_kwargs: Any) -> Any:
        return lambda f: f

__all__ = ["record"]

if TYPE_CHECKING:
    _T = TypeVar("_T")

_MISSING = dataclasses.MISSING
_PLAIN = object()  # a field's default when it has none


def _init(self, **kwargs) -> None:
    cls = type(self)
    for name, default, factory in cls.__record_spec__:
        if name in kwargs:
            value = kwargs.pop(name)
        elif factory is not None:
            value = factory()
        elif default is not _PLAIN:
            value = default
        else:
            raise TypeError(f"{cls.__qualname__}.__init__() missing required keyword-only argument: {name!r}")
        object.__setattr__(self, name, value)
    if kwargs:
        raise TypeError(f"{cls.__qualname__}.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")


def _values(self) -> tuple:
    return tuple(object.__getattribute__(self, name) for name in type(self).__record_names__)


def _repr(self) -> str:
    cls = type(self)
    return f"{cls.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in cls.__record_names__)})"


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self) -> int:
    return hash(_values(self))


def _setattr(self, name, value):
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self, name):
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _getstate(self):
    return _values(self)


def _setstate(self, state) -> None:
    for name, value in zip(type(self).__record_names__, state, strict=False):  # as pickled: fields in order
        object.__setattr__(self, name, value)


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[_T]) -> type[_T]:
    """Make ``cls`` a frozen, slotted, keyword-only record (see the module's docstring)."""
    annotations = cls.__dict__.get("__annotations__", {})
    spec: list[tuple[str, Any, Any]] = []
    fields: dict[str, dataclasses.Field[Any]] = {}
    for name, annotation in annotations.items():
        value = cls.__dict__.get(name, _MISSING)
        if isinstance(value, dataclasses.Field):
            f = value
            default = _PLAIN if f.default is _MISSING else f.default
            factory = None if f.default_factory is _MISSING else f.default_factory
        else:
            f = dataclasses.field(default=value)
            default, factory = (_PLAIN if value is _MISSING else value), None
        f.name, f.type, f.kw_only = name, annotation, True
        # what dataclasses.fields() keeps; a private marker typeshed does not declare
        f._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
        fields[name] = f
        spec.append((name, default, factory))
    namespace = {k: v for k, v in cls.__dict__.items() if k not in fields and k not in ("__dict__", "__weakref__")}
    namespace.update(
        __slots__=tuple(fields),
        __dataclass_fields__=fields,
        __record_spec__=tuple(spec),
        __record_names__=tuple(fields),
        __match_args__=(),
        __init__=_init,
        __repr__=_repr,
        __eq__=_eq,
        __hash__=_hash,
        __setattr__=_setattr,
        __delattr__=_delattr,
        __getstate__=_getstate,
        __setstate__=_setstate,
    )
    metaclass: type = type(cls)
    rebuilt: type[_T] = metaclass(cls.__name__, cls.__bases__, namespace)
    return rebuilt
