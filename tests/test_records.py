"""``artifactd.records.Record``: what a named tuple gave the first modules, without ``typing``."""

from __future__ import annotations

import pytest

from artifactd.records import Record


class Point(Record):
    x: int
    y: int
    label: str = ""
    tags: tuple[str, ...] = ()


def test_fields_defaults_and_construction() -> None:
    assert Point._fields == ("x", "y", "label", "tags")
    assert Point(1, 2) == Point(x=1, y=2, label="", tags=())
    p = Point(1, y=2, label="a")
    assert (p.x, p.y, p.label, p.tags) == (1, 2, "a", ())
    assert repr(p) == "Point(x=1, y=2, label='a', tags=())"
    assert p._asdict() == {"x": 1, "y": 2, "label": "a", "tags": ()}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1,), {}, "missing y"),
        ((1, 2, "a", (), 5), {}, "takes 4 fields"),
        ((1, 2), {"x": 3}, "repeated field 'x'"),
        ((1, 2), {"z": 3}, "unexpected or repeated field 'z'"),
    ],
)
def test_bad_construction_is_refused(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        Point(*args, **kwargs)  # type: ignore[arg-type]


def test_frozen_equal_and_hashable_by_value() -> None:
    p = Point(1, 2)
    with pytest.raises(AttributeError, match="frozen"):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del p.x
    assert p == Point(1, 2) and p != Point(1, 3)
    assert len({p, Point(1, 2), Point(2, 1)}) == 2

    class Other(Record):
        x: int
        y: int
        label: str = ""
        tags: tuple[str, ...] = ()

    assert Other(1, 2) != p  # one record type is not another with the same fields


def test_replace_makes_a_changed_copy() -> None:
    p = Point(1, 2, "a")
    q = p._replace(label="b")
    assert (p.label, q.label, q.x) == ("a", "b", 1)
    with pytest.raises(TypeError):
        p._replace(z=1)


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default follows"):

        class Bad(Record):
            a: int = 0
            b: int  # type: ignore[misc]  # the point: the type checker refuses it too
