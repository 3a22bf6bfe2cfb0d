"""The views the engine builds through ``frozen_build.builder`` are the frozen dataclass's own
instances in every respect: type, fields, equality, hash, repr, refusal to be changed, pickling,
``dataclasses.replace``."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from topas.engine.frozen_build import builder
from topas.engine.view import PrefixView, RequestView, prefix_view, request_view

REQUEST = ("t1/s2", "t1", "s2", "coder", 812, 17, 3.25, 829, 1.5, 1, 2.75, 96)
PREFIX = ("coder", 4096, 310.5, True, False, 2, 7.5, False, True, False)


@pytest.mark.parametrize("cls, build, fields", [(RequestView, request_view, REQUEST),
                                                (PrefixView, prefix_view, PREFIX)], ids=["request", "prefix"])
def test_a_built_view_is_the_dataclass_instance(cls, build, fields) -> None:
    made, built = cls(*fields), build(*fields)
    assert type(built) is cls
    assert dataclasses.astuple(built) == dataclasses.astuple(made) == fields
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    name = dataclasses.fields(cls)[1].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, name, 0)
    refused = []
    for v in (made, built):  # slotted: no other attribute (the error's type varies with Python)
        with pytest.raises((AttributeError, TypeError)) as e:
            v.not_a_field = 1
        refused.append(e.type)
    assert refused[0] is refused[1]
    assert pickle.loads(pickle.dumps(built)) == made
    assert dataclasses.replace(built, **{name: 0}) == dataclasses.replace(made, **{name: 0})


def test_a_request_views_properties_read_the_built_fields() -> None:
    v = request_view(*REQUEST)
    assert v.hold_tokens == 829 + 96
    assert v.admit_tokens == 812 + 17 + 1 + 96


def test_a_builder_needs_every_field() -> None:
    with pytest.raises(TypeError):
        request_view(*REQUEST[:-1])


@dataclasses.dataclass(slots=True)
class Mutable:
    x: int


@dataclasses.dataclass(frozen=True)
class NoSlots:
    x: int


@dataclasses.dataclass(frozen=True, slots=True)
class Checked:
    x: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x < 0")


@pytest.mark.parametrize("cls", [Mutable, NoSlots, Checked, int])
def test_only_frozen_slotted_dataclasses_without_checks_get_a_builder(cls) -> None:
    with pytest.raises(TypeError, match=cls.__name__):
        builder(cls)
