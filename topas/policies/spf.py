"""SPF: task-level shortest (expected) remaining processing first.

The workflow analogue of SRPT (Schrage 1968; the "SPF" baseline of docs/method.md "Setup and metrics"): waiting
requests are ordered by their *task's* expected remaining longest path, shortest first, so the
task closest to completion gets the GPU. Ties are broken by the task's arrival, then by the
stage's position in the task's topological order, then by request id (deterministic).

The expected remaining longest path of a task (``expected_remaining_path``) is
``topas.workload.critical_path.longest_remaining_path`` over the task's DAG, with finished stages
taking no time and every unfinished stage taking its expected residual service time from the
shared non-clairvoyant estimator (``topas.policies.estimates``):

- a *waiting* stage (ready, not running; possibly retracted earlier): ``stage_residual_time``
  conditioned on the tokens it has generated (``E[Y - g | Y > g]`` decode steps plus the prefill
  of its suffix input and of the ``g`` tokens to recompute);
- a *running* stage: the same, but without the prefill term (interpretation: a running request's
  prefill is done or in the current iteration, so only its expected remaining decode is left);
- a *pending* stage (parents unfinished): ``stage_residual_time`` from 0 generated tokens.

Output lengths come from an ``OutputEstimator`` fed by ``on_finish`` with the observed output of
every finished call (per agent, seeded by the agent's trace-level prior with ``prior_weight``
pseudo-observations). The policy never reads a true output length (the view has none).
Decode time per token is the engine's current operating point (``OperatingPoint.of(view)``), the
estimator's documented choice.

Interpretations we had to make (the paper names SPF but does not define it further):

- "remaining processing" is the remaining *critical path* (longest path), not the sum of the
  task's remaining work: on a DAG the task finishes when its longest remaining path does. On
  Chain-3 (A -> B -> C) the longest path is the sum of the remaining stages, so SPF *is* SRPT
  with expected sizes there (the paper: "SPF (which equals SRPT on Chain-3)");
- it is non-preemptive, like every policy that leaves prefixes to the engine: it only orders the
  waiting queue (the engine walks the order and stops at the first request that does not fit);
  a running request is never preempted for a shorter task. Engine retractions (decode out of
  memory) still happen, and a retracted request is re-ranked with its generated tokens;
- prefixes are left to the engine (SGLang radix cache: load on demand, LRU eviction).

Under ``online`` DAG visibility (issue 16) a task's unreached stages come from its workflow's
history (``topas.policies.history``: the last finished task of the workflow as a template; none
yet: only the reached stages count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from topas.engine.view import Decision, EngineView, RequestView, TaskView
from topas.policies.base import OMIT_DEFAULT, Policy, register
from topas.policies.estimates import OperatingPoint, OutputEstimator, StageParts, make_estimator
from topas.policies.history import WorkflowHistory


@dataclass(frozen=True)
class SPFParams:
    #: Pseudo-observations of the agent's trace-level output prior in the estimator.
    prior_weight: int = 1
    #: Output lengths: "online" (learned from finished requests, the prior as prior_weight
    #: observations) or "prior" (the prior only); see ``topas.policies.estimates``.
    output_estimator: Literal["online", "prior"] = field(default="online", metadata=OMIT_DEFAULT)


#: a stage that is neither running nor waiting: pending, nothing generated
_PENDING = (0, False)


def ready_stages(view: EngineView) -> dict[str, dict[str, tuple[int, bool]]]:
    """Per task, its running and waiting stages: ``{stage id: (generated tokens, running)}``."""
    out: dict[str, dict[str, tuple[int, bool]]] = {}
    for r in view.waiting:
        out.setdefault(r.task_id, {})[r.stage_id] = (r.generated, False)
    for r in view.running:  # a stage is never both; running wins as it did
        out.setdefault(r.task_id, {})[r.stage_id] = (r.generated, True)
    return out


_Shape = tuple[tuple[str, str, int, tuple[str, ...]], ...]


def unfinished_shape(task: TaskView) -> _Shape:
    """The task's unfinished stages in topological order, each as ``(stage id, agent, input
    tokens, children)``: a function of the (immutable) view, kept by :class:`SPF` while the view
    is the same object. A child of an unfinished stage is unfinished (a stage finishes after its
    parents)."""
    done, stages = task.done, task.stages
    return tuple((s, stages[s].agent, stages[s].input_tokens, stages[s].children)
                 for s in task.topo_order if s not in done)


def expected_remaining_path(
    view: EngineView,
    task: TaskView,
    est: OutputEstimator,
    op: OperatingPoint,
    ready: dict[str, tuple[int, bool]],
    memo: dict | None = None,
    shape: _Shape | None = None,
    parts: StageParts | None = None,
) -> float:
    """The task's expected remaining longest path (s).

    ``ready`` maps the task's running and waiting stages to ``(generated tokens, running)``
    (``ready_stages``; stages in neither are pending). ``memo`` (optional, one per decision)
    caches stage times by ``(agent, input tokens, generated, running)``: within one view they
    depend on nothing else. ``shape``: ``unfinished_shape(task)``, and ``parts``: a
    :class:`StageParts`, if the caller keeps them across decisions.
    """
    if memo is None:
        memo = {}
    if shape is None:
        shape = unfinished_shape(task)
    if parts is None:
        parts = StageParts()
    tpot = op.tpot
    times: dict[str, float] = {}
    for sid, agent, x, _ in shape:
        generated, is_running = ready.get(sid, _PENDING)
        key = (agent, x, generated, is_running)
        z = memo.get(key)
        if z is None:
            pv = view.prefixes[agent]
            rem = parts.remaining(est, agent, pv.expected_output_tokens, generated)
            if is_running:  # prefill done: only the expected remaining decode is left
                z = rem * tpot
            else:  # stage_residual_time
                z = parts.prefill(view, x + generated, pv.tokens) + rem * tpot
            memo[key] = z
        times[sid] = z
    # longest_remaining_path(topo_order, children, times, zero=done), inlined: this runs for every
    # task with a waiting request at every decision (the same sums and maxima, in the same order).
    # A finished stage would take 0.0 + the longest of its children's paths, each already a
    # candidate for the maximum, so only the unfinished stages are walked.
    lp: dict[str, float] = {}
    best = 0.0
    for v, _, _, children in reversed(shape):
        tail = 0.0
        for c in children:
            t = lp[c]
            if t > tail:
                tail = t
        val = lp[v] = times[v] + tail
        if val > best:
            best = val
    return best


@register
class SPF(Policy):
    name = "spf"
    Params = SPFParams

    def reset(self) -> None:
        self.est = make_estimator(self.params.output_estimator, self.params.prior_weight)
        self.history = WorkflowHistory()
        self._shapes: dict[str, tuple[TaskView, _Shape]] = {}  # by task: its view, unfinished_shape of it
        self._parts = StageParts()

    def on_finish(self, request: RequestView, time: float, output_tokens: int) -> None:
        self.est.observe(request.agent, output_tokens)

    def task_paths(self, view: EngineView) -> dict[str, float]:
        """Expected remaining longest path (s) of every task with a waiting request."""
        op = OperatingPoint.of(view)
        ready = ready_stages(view)
        memo: dict = {}
        out: dict[str, float] = {}
        tasks = self.history.tasks(view)  # online DAGs: completed from the workflow's history
        shapes = self._shapes
        kept: dict[str, tuple[TaskView, _Shape]] = {}
        # A task's path is a function of its unfinished stages (ids, agents, inputs, children) and
        # its ready stages' (generated, running), given this decision's estimator and operating
        # point: tasks alike in both (a workflow's tasks at the same progress) share one.
        paths: dict[tuple[_Shape, tuple], float] = {}
        for r in view.waiting:
            tid = r.task_id
            if tid not in out:
                tv = tasks[tid]
                hit = shapes.get(tid)
                if hit is None or hit[0] is not tv:
                    hit = (tv, unfinished_shape(tv))
                kept[tid] = hit
                ready_t = ready[tid]
                key = (hit[1], tuple(ready_t.items()))
                path = paths.get(key)
                if path is None:
                    path = paths[key] = expected_remaining_path(view, tv, self.est, op, ready_t, memo, hit[1],
                                                                self._parts)
                out[tid] = path
        self._shapes = kept  # the tasks with a waiting request now
        return out

    def decide(self, view: EngineView) -> Decision:
        paths = self.task_paths(view)
        tasks = view.tasks

        def key(r: RequestView):
            t = tasks[r.task_id]
            return (paths[r.task_id], t.arrival, t.topo_order.index(r.stage_id), r.rid)

        order = sorted(view.waiting, key=key)
        return Decision(admit=tuple(r.rid for r in order))
