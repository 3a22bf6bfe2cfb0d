"""The metadata a replayed request carries to the plugin (``sampling_params.custom_params["topas"]``,
or, for a router that drops it, appended to the request id): :class:`RequestMeta`, the task's DAG
without output lengths, the agents table, arrival and ready times; and the decisions table's
columns both engines fill.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping


META_KEY = "topas"
META_VERSION = 1

#: Columns of the decisions table (``SimResult.decisions``) that both engines fill.
DECISION_COLUMNS = ["time", "wall_s", "n_waiting", "n_running", "n_proposed", "n_admitted",
                    "n_preempt", "n_evict", "n_load"]


@dataclass(frozen=True)
class RequestMeta:
    """What a replayed request tells the scheduler about its workflow (no output lengths)."""

    run: str
    t0: float  # the run's start, seconds since the epoch (client clock)
    task: str
    stage: str
    workflow: str
    arrival: float  # tau_i, seconds since t0
    ready: float  # when the request became ready (its parents finished), seconds since t0
    dag: tuple[tuple[str, str, int, tuple[str, ...]], ...]  # (stage, agent, x_v, parents)
    agents: tuple[tuple[str, int, float], ...]  # (name, l_a, expected output) for every agent
    policy: str | None = None  # the run's policy (overrides the server's default) ...
    params: tuple[tuple[str, Any], ...] = ()  # ... and its parameters
    #: what the policy may know (``topas.engine.knowledge.Knowledge.settings()``; () = everything)
    knowledge: tuple[tuple[str, Any], ...] = ()

    @property
    def rid(self) -> str:
        """The request's id as the policy sees it (the simulator's ``task/stage``)."""
        return f"{self.task}/{self.stage}"

    def _own_row(self) -> tuple[str, str, int, tuple[str, ...]]:
        """This request's row of ``dag``: (stage, agent, x_v, parents)."""
        for row in self.dag:
            if row[0] == self.stage:
                return row
        raise KeyError(self.stage)

    @property
    def agent(self) -> str:
        return self._own_row()[1]

    @property
    def input_tokens(self) -> int:
        return self._own_row()[2]

    def to_json(self) -> str:
        d = {
            "v": META_VERSION, "run": self.run, "t0": self.t0, "task": self.task, "stage": self.stage,
            "workflow": self.workflow, "arrival": self.arrival, "ready": self.ready,
            "dag": [[s, a, x, list(p)] for s, a, x, p in self.dag],
            "agents": [[n, l, e] for n, l, e in self.agents],
            "policy": self.policy, "params": dict(self.params),
        }
        if self.knowledge:  # absent when everything is known (the metadata of before issue 16)
            d["knowledge"] = dict(self.knowledge)
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "RequestMeta":
        d = json.loads(text)
        if d.get("v") != META_VERSION:
            raise ValueError(f"topas metadata version {d.get('v')!r}, expected {META_VERSION}")
        return cls(
            run=str(d["run"]), t0=float(d["t0"]), task=str(d["task"]), stage=str(d["stage"]),
            workflow=str(d.get("workflow", "")), arrival=float(d["arrival"]), ready=float(d["ready"]),
            dag=tuple((str(s), str(a), int(x), tuple(str(q) for q in p)) for s, a, x, p in d["dag"]),
            agents=tuple((str(n), int(l), float(e)) for n, l, e in d["agents"]),
            policy=d.get("policy"), params=tuple(sorted((d.get("params") or {}).items())),
            knowledge=tuple(sorted((d.get("knowledge") or {}).items())),
        )


def meta_from_custom_params(custom_params: Any) -> RequestMeta | None:
    """The topas metadata in a request's ``custom_params`` (``None`` if it has none).

    Raises ``ValueError`` for metadata that is present but malformed."""
    if not isinstance(custom_params, Mapping) or META_KEY not in custom_params:
        return None
    raw = custom_params[META_KEY]
    try:
        return RequestMeta.from_json(raw if isinstance(raw, str) else json.dumps(raw))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed topas metadata in custom_params: {e}") from e


#: A request id may carry the metadata after this marker (``<rid>#topas=<RequestMeta JSON>``):
#: ``sglang-router`` 0.3.2 parses ``/generate`` bodies into its own typed request and forwards only
#: the fields it knows, which keeps ``rid`` but drops ``sampling_params.custom_params``.
RID_META_MARK = "#topas="


def rid_with_meta(rid: str, meta: RequestMeta) -> str:
    """``rid`` carrying ``meta`` (:data:`RID_META_MARK`), for a path that drops ``custom_params``."""
    if RID_META_MARK in rid:
        raise ValueError(f"request id {rid!r} already contains {RID_META_MARK!r}")
    return f"{rid}{RID_META_MARK}{meta.to_json()}"


def short_rid(rid: Any) -> Any:
    """A request id without the metadata :func:`rid_with_meta` appended (unchanged otherwise)."""
    return rid.split(RID_META_MARK, 1)[0] if isinstance(rid, str) else rid


def meta_from_request(custom_params: Any, rid: Any = None) -> RequestMeta | None:
    """The topas metadata of a request: from its ``custom_params`` (:func:`meta_from_custom_params`),
    else from its id (:func:`rid_with_meta`); ``None`` if neither has any. ``ValueError`` for
    metadata that is present but malformed."""
    meta = meta_from_custom_params(custom_params)
    if meta is None and isinstance(rid, str) and RID_META_MARK in rid:
        try:
            meta = RequestMeta.from_json(rid.split(RID_META_MARK, 1)[1])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed topas metadata in the request id: {e}") from e
    return meta
