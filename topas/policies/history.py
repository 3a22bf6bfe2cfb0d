"""What SPF and TOPAS fall back to when DAGs are shown ``online`` (issue 16).

Under ``dag_visibility="online"`` (``topas.engine.knowledge``) a :class:`TaskView` holds only the
stages reached so far (``complete=False``). A task's expected remaining longest path then has to
come from *history*, not from the future: :class:`WorkflowHistory` remembers, per workflow name,
the DAG of the workflow's most recently finished task as the policy saw it (a finished task has
had every stage reached, and every stage waits for a decision before it runs, so its last view
holds its whole DAG), and :meth:`WorkflowHistory.complete` extends a partial task with that
template's stages it has not reached yet, matched by stage id (the traces number stages in
order: ``A``, ``B``... or ``c0001``, ``c0002``...). The predicted stages keep the template's
agents, input lengths and edges; their outputs come from the policy's output estimator as for
any unstarted stage.

Rules (our choice; the paper assumes full DAGs):

* no finished task of the workflow yet: the partial DAG as it is (the remaining path is then
  only the reached stages');
* the most recent finished task is the template (a workflow whose shape drifts is followed);
* the completion is a view: nothing is admitted from it (predicted stages have no request), it
  only lengthens remaining paths and, in TOPAS, counts predicted next-hop stages in ``n_a(t)``.

With full visibility every view is complete and :meth:`tasks` returns ``view.tasks`` itself (no
bookkeeping, bit-identical results).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from topas.engine.view import EngineView, StageView, TaskView


def complete_from_template(tv: TaskView, template: TaskView) -> TaskView:
    """``tv`` extended with the stages of ``template`` it has not reached (matched by id)."""
    hidden = [s for s in template.topo_order if s not in tv.stages]
    if not hidden:
        return tv
    hidden_set = set(hidden)
    stages: dict[str, StageView] = {}
    for sid in tv.topo_order:
        st = tv.stages[sid]
        extra = tuple(c for c in template.stages[sid].children if c in hidden_set) if sid in template.stages else ()
        stages[sid] = StageView(st.id, st.agent, st.input_tokens, st.parents, st.children + extra) if extra else st
    for sid in hidden:
        t = template.stages[sid]
        parents = tuple(p for p in t.parents if p in hidden_set or p in stages)
        children = tuple(c for c in t.children if c in hidden_set)
        stages[sid] = StageView(t.id, t.agent, t.input_tokens, parents, children)
    return TaskView(
        id=tv.id, arrival=tv.arrival, workflow=tv.workflow, stages=MappingProxyType(stages),
        topo_order=tv.topo_order + tuple(hidden), done=tv.done, observed_output=tv.observed_output,
        complete=False,
    )


class WorkflowHistory:
    """Per-workflow DAG templates from finished tasks (see the module docstring)."""

    def __init__(self) -> None:
        self.templates: dict[str, TaskView] = {}
        self._last: dict[str, TaskView] = {}  # partial tasks' latest views, by task id
        self._completed: dict[str, tuple[TaskView, TaskView, TaskView]] = {}  # tid -> (tv, template, out)

    def observe(self, view: EngineView) -> None:
        """Learn from ``view``: a partial task seen before and gone now has finished."""
        for tid in sorted(t for t in self._last if t not in view.tasks):
            tv = self._last.pop(tid)
            self.templates[tv.workflow] = tv
            self._completed.pop(tid, None)
        for tid, tv in view.tasks.items():
            if not tv.complete:
                self._last[tid] = tv

    def complete(self, tv: TaskView) -> TaskView:
        """``tv`` itself if complete or its workflow has no template yet, else the completion."""
        if tv.complete:
            return tv
        template = self.templates.get(tv.workflow)
        if template is None:
            return tv
        hit = self._completed.get(tv.id)
        if hit is not None and hit[0] is tv and hit[1] is template:
            return hit[2]
        out = complete_from_template(tv, template)
        self._completed[tv.id] = (tv, template, out)
        return out

    def tasks(self, view: EngineView) -> Mapping[str, TaskView]:
        """The view's tasks with partial ones completed from history (call once per decision)."""
        if all(tv.complete for tv in view.tasks.values()):
            return view.tasks
        self.observe(view)
        return {tid: self.complete(tv) for tid, tv in view.tasks.items()}
