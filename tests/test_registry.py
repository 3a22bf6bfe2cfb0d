"""The one registry behind policies, routers, eviction strategies, engines and priority rules."""

from __future__ import annotations

import pytest

from topas.cluster.routers.base import _REGISTRY as routers
from topas.engine.eviction import _REGISTRY as evictions
from topas.engine.registry import _REGISTRY as engines
from topas.policies.base import _REGISTRY as policies
from topas.registry import Registry
from topas.sglang.priority import RULES


class Error(ValueError):
    pass


def test_names_in_registration_order_and_unknown_names_listed():
    r = Registry("widget", valid="valid widgets", error=Error)
    assert r.add("b", 1) == 1 and r.add("a", 2) == 2
    assert r.names() == ["b", "a"] and r.items() == [("b", 1), ("a", 2)] and "a" in r and "c" not in r
    assert r.get("a") == 2
    with pytest.raises(Error, match=r"unknown widget 'c'; valid widgets: b, a"):
        r.get("c")
    with pytest.raises(Error, match=r"unknown widget \['x'\]"):
        r.get(["x"])  # type: ignore[arg-type]


def test_a_taken_name_is_refused_unless_the_same_entry_comes_again():
    class A:
        pass

    class B:
        pass

    r: Registry[type] = Registry("widget", valid="valid widgets", error=Error)
    r.add("a", A)
    assert r.add("a", A) is A
    with pytest.raises(Error, match=r"widget 'a' is already registered \(.*A\)"):
        r.add("a", B)


def test_a_copy_is_independent_and_a_suggestion_replaces_the_listing():
    r = Registry("widget", valid="valid", suggest=lambda: ["shown"])
    r.add("hidden", 0)
    c = r.copy()
    c.add("new", 1)
    assert r.names() == ["hidden"] and c.names() == ["hidden", "new"]
    with pytest.raises(ValueError, match=r"unknown widget 'x'; valid: shown$"):
        c.get("x")


def test_builtins_register_on_the_first_lookup():
    r = Registry("module", valid="valid", builtins="topas.paths")
    assert r.names() == []  # the import ran and registered nothing


@pytest.mark.parametrize("registry", [policies, routers, evictions, engines, RULES])
def test_every_registry_of_the_package_is_one_of_these(registry):
    assert isinstance(registry, Registry) and registry.names()
