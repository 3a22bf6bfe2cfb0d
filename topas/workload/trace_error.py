"""The error of an invalid trace (:class:`TraceError`): the message names the file, the task and
stage (or the agent) and the rule broken; the attributes keep the location, across processes too."""

from __future__ import annotations


class TraceError(ValueError):
    """An invalid trace. ``str(err)`` is the full message; the attributes locate the problem.

    Attributes: ``source`` (file or other origin), ``task``, ``stage``, ``agent`` (``None`` when
    not applicable) and ``rule`` (the message without the location prefix).
    """

    def __init__(
        self,
        source: str,
        rule: str | None = None,
        *,
        task: str | None = None,
        stage: str | None = None,
        agent: str | None = None,
        where: str | None = None,
    ) -> None:
        self.source = source
        self.rule = rule
        self.task = task
        self.stage = stage
        self.agent = agent
        if rule is None:  # TraceError("a whole message"), also how a pickled error is rebuilt
            super().__init__(source)
            return
        parts = [source]
        if where is not None:
            parts.append(where)
        else:
            if agent is not None:
                parts.append(f"agent {agent}")
            if task is not None:
                parts.append(f"task {task}" + (f" stage {stage}" if stage is not None else ""))
        super().__init__(": ".join(parts + [rule]))

    def __reduce__(self):  # keep the location attributes across processes (sweeps pickle errors)
        return (_rebuild, (self.source, self.rule, self.task, self.stage, self.agent, str(self)))


def _rebuild(source, rule, task, stage, agent, message) -> TraceError:
    e = TraceError(message)
    e.source, e.rule, e.task, e.stage, e.agent = source, rule, task, stage, agent
    return e
