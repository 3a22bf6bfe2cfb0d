"""``topas policies``, ``topas routers`` and ``topas evictions``: what can be named, with each
one's parameters."""

from __future__ import annotations

import dataclasses
import sys
import typing

import click

from topas.cli.group import main
from topas.engine.eviction import available_evictions


def policies_lines() -> list[str]:
    """The ``topas policies`` listing: each policy, its one-line description and its parameters."""
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.policies.base import available_policies, policy_class

    lines: list[str] = []
    for name in available_policies():
        cls = policy_class(name)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        head = doc[0].strip() if doc else ""
        fixed = dict(getattr(cls, "FIXED", {}) or {})
        prefixes = "manages prefixes" if cls.manages_prefixes else "engine manages prefixes (LRU)"
        lines.append(f"{name}  [{prefixes}]" + (f"  {head}" if head else ""))
        lines += params_lines(cls.Params, fixed)
    return lines


def params_lines(params: type, fixed: dict | None = None) -> list[str]:
    """``    name: type = default`` for each field of a parameters dataclass (``fixed``: values an
    ablation fixes, marked so), or ``    (no parameters)``: the body of ``topas policies`` and
    ``topas routers``."""

    fixed = fixed or {}
    fields = dataclasses.fields(params)
    hints = typing.get_type_hints(params)
    lines = [] if fields else ["    (no parameters)"]
    for f in fields:
        typ = hints.get(f.name, f.type)
        if typing.get_origin(typ) is typing.Literal:
            tname = " | ".join(repr(c) for c in typing.get_args(typ))
        else:
            tname = getattr(typ, "__name__", None) or str(typ).replace("typing.", "")
        if f.name in fixed:
            lines.append(f"    {f.name}: {tname} = {fixed[f.name]!r}  (fixed by this ablation)")
        else:
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            lines.append(f"    {f.name}: {tname} = {default!r}")
    return lines


@main.command("policies")
def policies_cmd() -> None:
    """List the policies with their parameters (name: type = default); set them with --param."""
    click.echo("\n".join(policies_lines()))


def routers_lines() -> list[str]:
    """The ``topas routers`` listing: each router, its one-line description and its parameters."""
    # lazy: loaded when the command runs, so `topas --help` stays fast
    from topas.cluster.routers import available_routers, router_class

    lines: list[str] = []
    for name in available_routers():
        cls = router_class(name)
        doc = (cls.__doc__ or sys.modules[cls.__module__].__doc__ or "").strip().splitlines()
        head = doc[0].strip() if doc else ""
        head = head.removeprefix(f"``{name}``:").strip()
        lines.append(f"{name}" + (f"  {head}" if head else ""))
        lines += params_lines(cls.Params)
    return lines


@main.command("routers")
def routers_cmd() -> None:
    """List the routers of a cluster with their parameters (name: type = default); use them with
    `topas simulate --engines N --router NAME --router-param K=V`."""
    click.echo("\n".join(routers_lines()))


def evictions_lines() -> list[str]:
    """The ``topas evictions`` listing: each eviction strategy, its one-line description and its
    parameters (``topas.engine.eviction``)."""

    lines: list[str] = []
    for name, (desc, params) in available_evictions().items():
        lines.append(f"{name}  {desc}")
        lines += [f"    {k}: int = {v!r}" for k, v in params.items()] or ["    (no parameters)"]
    return lines


@main.command("evictions")
def evictions_cmd() -> None:
    """List the radix cache's eviction strategies with their parameters (name: type = default);
    use them with `topas simulate --eviction NAME[:key=value,...]`."""
    click.echo("\n".join(evictions_lines()))
