"""TOPAS's search over R', compiled: the decision's quantities as arrays, the search run by the
numba kernels (``topas_kernel_search``, ``topas_kernel_score``), the best plan built back.

The readable search (:class:`topas.policies.topas_search.PrefixSearch`, with
``_DecisionCtx._evaluate``: GREEDYPACK and the terms J_admit, J_move, J_redo, J_revoke and
V_reuse of ``topas_terms``) is the reference: the compiled one makes the same decisions bit for bit
(``tests/test_topas_compiled.py`` runs both on every pinned configuration), and the reference runs
when :data:`ENABLED` is false (``TOPAS_SEARCH=reference`` in the environment), and for a decision
with more agents than a bitmask holds.

Where the compiled set-up (``topas_setup_compiled``) runs, it has laid the arrays out and run the
kernel already (``_compiled``); elsewhere :meth:`CompiledSearch._kernel_arrays` lays them out from
the fused or readable set-up's dicts.

Loading the kernels costs a process about 0.7 s of CPU once (numba's import and start-up, the
kernels from numba's cache; their first compilation, once per machine, numba version and kernel
source, about 30 s for the search and 10 s for the set-up): a process searches with the reference
until its searches have taken :data:`LOAD_AFTER_S` (the decisions are the same either way), so a
short run never pays it and a long one pays it once it has spent as much (docs/design.md
"Performance"). :func:`load` loads them at once (the benchmarks do).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from topas.policies.topas_search import PrefixSearch, _Plan

#: Run the compiled search (False: the reference, ``PrefixSearch.search``).
ENABLED = os.environ.get("TOPAS_SEARCH", "compiled") != "reference"
#: Python's ``sum()`` over floats is Neumaier-compensated from CPython 3.12; the kernels do the same.
COMPENSATED = sys.version_info >= (3, 12)
MAX_AGENTS = 62  #: a prefix set is an int64 bitmask
#: Seconds of reference search a process spends before it loads the kernels (see the docstring).
LOAD_AFTER_S = 0.5
_kernel: Any = None
_reference_s = 0.0  # the reference's search time so far, until the kernels are loaded


def load() -> Any:
    """The compiled search's kernel, loaded now (and run once, on a decision with nothing in it)
    if it is not yet, with the compiled set-up's (``topas_kernel_setup``)."""
    global _kernel
    if _kernel is None:
        # numba (0.2 s to import, 0.4 s to start) only once TOPAS has searched for a while, not at
        # every import of topas
        from topas.policies.topas_kernel_score import N_SCALARS
        from topas.policies.topas_kernel_search import cached_search_kernel as search_kernel

        # no agents, no requests: the counts, the scalars, and the one offset of the busy agents'
        # rows and of the parent links
        search_kernel(np.zeros(8 + N_SCALARS + 2, np.int64), np.zeros(2), np.empty(1, np.int64), np.empty(6))
        # and the compiled set-up with it (``topas_setup_compiled``), on a decision with nothing in it
        from topas.policies.topas_kernel_setup import N_FHEAD, N_HEAD, cached_setup_kernel

        cached_setup_kernel(np.zeros(N_HEAD, np.int64), np.zeros(N_FHEAD))
        _kernel = search_kernel
    return _kernel


def _exact_floats(*groups: Any) -> bool:
    """Every value a float (not a subclass such as numpy's float64, which CPython's compensated
    ``sum()`` adds without compensation)."""
    return all(type(x) is float for g in groups for x in g)  # noqa: E721 (exactly float)


class CompiledSearch(PrefixSearch):
    """:class:`PrefixSearch` whose :meth:`search` runs the compiled kernels."""

    def search(self) -> tuple[_Plan, int]:
        global _reference_s
        if not ENABLED or len(self.view.prefixes) > MAX_AGENTS:
            return PrefixSearch.search(self)
        if _kernel is None and _reference_s < LOAD_AFTER_S:
            t0 = time.perf_counter()
            out = PrefixSearch.search(self)
            _reference_s += time.perf_counter() - t0
            return out
        compiled = self.__dict__.get("_compiled")  # set up and searched by ``topas_setup_compiled``
        if compiled is not None:
            names, waiting, _, _, cands, gain, admitted, out, res = compiled
            found, mask, n_pre, n_adm, reuse_any, seen, full = res
        else:
            try:
                args = self._kernel_arrays()
            except KeyError:  # an agent of a request that the view has no prefix for: the reference copes
                args = None
            if args is None:
                return PrefixSearch.search(self)
            ints, floats, names = args
            admitted, out = np.empty(len(self._packable) + 1, np.int64), np.empty(6)
            found, mask, n_pre, n_adm, reuse_any, seen, full = load()(ints, floats, admitted, out)
        self._n_full = int(full)  # sets scored in full (benchmarks/policy_cost.py)
        best = None
        if found:
            resident = frozenset(a for i, a in enumerate(names) if (mask >> i) & 1)
            if compiled is not None:
                admit = [(waiting[j].rid, float(gain[j])) for j in cands[admitted[:n_adm]].tolist()]
            else:
                packable = self._packable
                admit = [(packable[i][0], packable[i][3]) for i in admitted[:n_adm].tolist()]
            preempt = sorted(r.rid for a in self._busy_order if a not in resident for r in self.running_by_agent[a])
            p = self.p
            terms = {
                "J_admit": float(out[0]),
                # Python's types as well as its values: an empty sum is the int 0
                "J_move": float(out[1]) if resident != self.r_t else 0,
                "J_redo": float(out[2]),
                "J_revoke": float(out[3]),
                "V_reuse": (float(out[4]) if reuse_any else p.beta * 0) if p.reuse else 0.0,
            }
            best = _Plan(resident, admit, preempt, float(out[5]), terms)
        self._best = best
        if best is None or (not best.admit and not self.view.running):
            best = self._liveness() or best
        assert best is not None, "the current prefix set is always feasible"
        return best, int(seen) + len(self._memo)

    def _kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
        """The kernel's two arguments, every integer and every float of the decision laid out as
        ``topas_kernel_score.unpack`` reads them (each table row by row, with
        ``topas_kernel_score``'s columns), and the agents' names in bit order; None if a value is
        of a type the kernels would sum otherwise."""
        p, view = self.p, self.view
        # the per-agent rows, kept across decisions (``topas_state``), with this decision's guard
        # caps and V_reuse's most
        state = self.policy._state
        names, idx, pref_order = state.names, state.idx, state.pref_order
        ai = state.kernel_ints.copy()  # agents: l_a, the guard's cap
        af = state.kernel_floats.copy()  # agents: the moves, the reload price, V_reuse's most
        for a, cap in self._caps.items():
            ai[2 * idx[a] + 1] = cap
        for a, w in self._reuse_max:
            af[4 * idx[a] + 3] = w
        run_demand, credit, prefix_len = self.run_demand, self.credit, self.prefix_len
        tasks: dict[str, int] = {}
        reprefill = p.redo == "reprefill"
        finish = self.finish_in if reprefill else None
        by_parent = self._la_by_parent
        ri: list[int] = []  # running requests: agent, y_r, task, kept demand
        rf: list[float] = []  # running requests: lambda_r, the reprefill's prefill and finish
        busy_agent: list[int] = []
        busy_start = [0]
        parents: list[tuple[int, ...]] = []  # each request's pending stages
        for a in self._busy_order:
            i = idx[a]
            for r in self.running_by_agent[a]:
                rid = r.rid
                ri += (i, r.generated, tasks.setdefault(r.task_id, len(tasks)), run_demand[rid])
                if reprefill:
                    rf += (credit[rid], self.cost.prefill_time([(r.input_tokens + r.generated, prefix_len[a])]),
                           finish[rid])
                else:
                    rf += (credit[rid], 0.0, 0.0)
                parents.append(by_parent.get(rid, ()))
            busy_agent.append(i)
            busy_start.append(len(parents))
        ci: list[int] = []  # candidates: agent, task, the request id's task, d_r(t)
        cf: list[float] = []  # candidates: gain, finish
        for rid, agent, task_id, gain, need in self._packable:
            t = tasks.setdefault(task_id, len(tasks))
            rid_task = rid.split("/", 1)[0]
            ci += (idx[agent], t, t if rid_task == task_id else tasks.setdefault(rid_task, len(tasks)), need)
            cf += (gain, finish[rid] if reprefill else 0.0)
            parents.append(by_parent.get(rid, ()))
        task_running = [0] * len(tasks)
        for t, k in self._running_per_task.items():
            task_running[tasks[t]] = k
        pi: list[int] = []  # pending stages: agent, parents, running parents, counted for Q' = running
        for (agent, _), n, k, b in zip(self.pending, self._la_need, self._la_running, self._la_in_base):
            pi += (idx.get(agent, -1), n, k, b)
        ptr = [0]
        flat: list[int] = []
        for x in parents:
            flat += x
            ptr.append(len(flat))
        if COMPENSATED and not _exact_floats(af, rf, cf):
            return None
        ints = [len(names), len(parents) - len(cf) // 2, len(busy_agent), len(cf) // 2, len(pi) // 4, len(flat),
                len(tasks), len(self.pool),
                view.kv_budget, p.K, p.K if p.preempt else 0, len(self.pool) <= p.M or p.search == "exhaustive",
                p.search == "local+", reprefill, p.reuse, COMPENSATED, sum(1 << idx[a] for a in self.r_t),
                sum(1 << idx[a] for a in self.must)]
        ints += ai
        ints += ri
        ints += busy_agent
        ints += busy_start
        ints += ci
        ints += pi
        ints += ptr
        ints += flat
        ints += task_running
        ints += [idx[a] for a in self.pool]
        ints += pref_order
        return np.array(ints, np.int64), np.array([p.beta, self.tpot] + af + rf + cf, np.float64), names
