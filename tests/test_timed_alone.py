"""``make reproduce`` times TOPAS's decision-overhead runs alone: before anything else, one at a
time, and not again once stored."""

from __future__ import annotations

import argparse

from pipeline import reproduce as pipeline_reproduce
from studies import grid


class _Store:
    def __init__(self, stored=()):
        self.stored = set(stored)

    def has(self, e) -> bool:
        return e in self.stored


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"quick": True, "no_progress": True, **kw})


def test_the_overhead_runs_are_run_one_at_a_time(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("topas.experiments.run_many", lambda exps, **kw: calls.append((list(exps), kw)) or [])
    store = _Store()
    pipeline_reproduce.run_timed_alone(_args(), store)
    assert len(calls) == 1
    exps, kw = calls[0]
    assert exps == grid.overhead_runs(quick=True) and kw["jobs"] == 1 and kw["store"] is store
    assert "one at a time" in capsys.readouterr().out


def test_stored_overhead_runs_are_not_run_again(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr("topas.experiments.run_many", lambda exps, **kw: calls.append(list(exps)) or [])
    pipeline_reproduce.run_timed_alone(_args(), _Store(grid.overhead_runs(quick=True)))
    assert calls == [] and capsys.readouterr().out == ""
    first, *rest = grid.overhead_runs(quick=False)  # three seeds
    pipeline_reproduce.run_timed_alone(_args(quick=False), _Store([first]))
    assert calls == [rest]
