"""Frozen records for the modules a pod start loads first, without the ``typing`` module.

Why this module exists: ``typing.NamedTuple`` and ``dataclasses`` each cost
more than a pod start can spare (``typing`` with ``re``: 41 million
instructions; ``dataclasses`` loads ``inspect``: 43 million; a bare Python
start is 36 million), and the modules a pod start loads (:data:`artifactd.cli.fast.LIGHT`, held to
:data:`~artifactd.cli.fast.FLOOR`)
need a few small records (a command-line option, a number range, an installed
distribution). :class:`Record` gives them what a named tuple gave: fields
declared as class annotations, defaults as class attributes, positional or
keyword construction, equality and hashing by value, ``_replace`` and
``_asdict``, immutability. Type checkers read a subclass as a frozen
dataclass (``dataclass_transform``), so its constructor is checked as a named
tuple's was. It is not a tuple: it cannot be unpacked or indexed.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    R = TypeVar("R", bound="Record")
else:

    def dataclass_transform(**_kwargs: object) -> object:
        """At run time, nothing: the decorator only tells type checkers how records are built."""
        return lambda cls: cls


@dataclass_transform(frozen_default=True, eq_default=True)
class Record:
    """A frozen record: the fields are a subclass's annotations, in order; defaults its values."""

    __slots__ = ()
    #: The field names, in declaration order (set for each subclass).
    _fields: ClassVar[tuple[str, ...]] = ()
    #: The fields that have a default, and the default.
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, None] = {}
        for klass in reversed(cls.__mro__):
            fields.update(dict.fromkeys(vars(klass).get("__annotations__", {})))
        cls._fields = tuple(f for f in fields if not f.startswith("_"))
        cls._defaults = {f: getattr(cls, f) for f in cls._fields if hasattr(cls, f)}
        missing = [f for f in cls._fields if f not in cls._defaults]
        if any(cls._fields.index(m) > cls._fields.index(f) for f in cls._defaults for m in missing):
            raise TypeError(f"{cls.__name__}: a field without a default follows one with a default")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self._fields
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes {len(fields)} fields, got {len(args)}")
        values = dict(zip(fields, args, strict=False))  # more args than fields: refused above
        for name, value in kwargs.items():
            if name not in fields or name in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {name!r}")
            values[name] = value
        absent = [f for f in fields if f not in values and f not in self._defaults]
        if absent:
            raise TypeError(f"{type(self).__name__}: missing {', '.join(absent)}")
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({shown})"

    def _asdict(self) -> dict[str, Any]:
        """Return the fields and their values, in order."""
        return {f: getattr(self, f) for f in self._fields}

    def _replace(self: R, **changes: Any) -> R:
        """Return a copy with ``changes`` made (as a named tuple's ``_replace``)."""
        return type(self)(**(self._asdict() | changes))
