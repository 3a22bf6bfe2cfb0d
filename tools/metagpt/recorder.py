"""Record every LLM call of a MetaGPT run, without editing MetaGPT (runs inside a MetaGPT venv).

:func:`start_run` (via :func:`install`, once per process) wraps, at class level:

- ``OpenAILLM.acompletion_text`` (every chat call of the OpenAI provider, streamed or not): one
  JSON line per call with the calling role and action (taken from the call stack), the full
  messages, the answer, cl100k token counts (tiktoken), wall-clock start and end, the tenacity
  attempt number (bad-JSON retries are real extra calls) and the ids of the calls whose outputs
  this call consumed (``parents``);
- ``openai``'s ``AsyncCompletions.create``: adds ``X-Topas-Run/-Call/-Role/-Action`` headers so
  the offline responder knows which action it answers (a real server ignores them);
- ``Role._observe``: the messages a role takes in; ``Environment.publish_message`` (and
  ``MGXEnv.publish_message``, which overrides it in TeamLeader mode): which role's calls produced
  each message.

Dependencies (the ``parents`` of a call): the previous call of the same role (a role acts
sequentially, and later calls read what earlier ones wrote to the repository), plus, for each
message the role observed since its previous call, the last call the message's publisher made
before publishing it. A message published by no role (the user's requirement) has no call.

The record format (one JSON object per line) is documented in tools/metagpt/README.md and read
by ``topas.workload.metagpt``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import os
import threading
import time
from typing import Any

RECORD_VERSION = "topas.metagpt-calls/1"

_state: dict[str, Any] = {}
_lock = threading.Lock()
_current: contextvars.ContextVar[dict | None] = contextvars.ContextVar("topas_call", default=None)


def _encoder():
    import tiktoken

    return tiktoken.get_encoding("cl100k_base")


def _caller():
    """(role object, action object, role-frame function name) from the current call stack."""
    from metagpt.actions.action import Action
    from metagpt.roles.role import Role

    role = action = None
    func = ""
    f = inspect.currentframe()
    while f is not None:
        s = f.f_locals.get("self")
        if action is None and isinstance(s, Action):
            action = s
        if role is None and isinstance(s, Role):
            role = s
            func = f.f_code.co_name
        if role is not None:
            # an action run by a role: the action's own frame is below the role's
            break
        f = f.f_back
    if role is None and action is not None:
        role = getattr(action, "_topas_role", None)
    return role, action, func


def _attempt() -> int:
    """tenacity's attempt number if the call runs inside a @retry, else 1."""
    f = inspect.currentframe()
    while f is not None:
        rs = f.f_locals.get("retry_state")
        n = getattr(rs, "attempt_number", None)
        if isinstance(n, int):
            return n
        f = f.f_back
    return 1


def _role_state(role) -> dict:
    key = id(role)
    st = _state["roles"].get(key)
    if st is None:
        st = _state["roles"][key] = {"last": None, "pending": [], "last_attempt_call": None}
    return st


def _emit(rec: dict) -> None:
    with _lock:
        _state["fh"].write(json.dumps(rec, ensure_ascii=False) + "\n")
        _state["fh"].flush()


def start_run(out_path: str, run: dict) -> None:
    """Record the next run into ``out_path`` (JSONL); ``run`` is stored in every record
    (``run_id``, ``workflow``, ``requirement``, ...). Installs the hooks on first use; several runs
    can be recorded one after another in one process (call ids restart at c0001)."""
    close()
    if not _state.get("installed"):
        install()
    run = dict(run)
    # the run's METAGPT_PROJECT_ROOT appears in prompts (workspace paths); the converter masks it
    run.setdefault("workdir", os.environ.get("METAGPT_PROJECT_ROOT", ""))
    _state.update(fh=open(out_path, "a", encoding="utf-8"), run=run, seq=0, roles={}, msg_src={})


def install() -> None:
    """Install the hooks (once per process)."""
    from metagpt.environment.base_env import Environment
    from metagpt.provider.openai_api import OpenAILLM
    from metagpt.roles.role import Role

    _state.update(installed=True, enc=_encoder())

    orig_text = OpenAILLM.acompletion_text

    @functools.wraps(orig_text)
    async def acompletion_text(self, messages, *args, **kwargs):
        role, action, func = _caller()
        with _lock:
            _state["seq"] += 1
            call_id = f"c{_state['seq']:04d}"
        role_cls = type(role).__name__ if role is not None else "Unknown"
        action_name = type(action).__name__ if action is not None else f"{role_cls}.{func or 'call'}"
        st = _role_state(role) if role is not None else {"last": None, "pending": [], "last_attempt_call": None}
        parents = []
        if st["last"] is not None:
            parents.append(st["last"])
        for p in st["pending"]:
            if p not in parents and p != call_id:
                parents.append(p)
        attempt = _attempt()
        retry_of = st["last"] if attempt > 1 else None
        if attempt == 1:
            st["pending"] = []
        meta = {"run": _state["run"]["run_id"], "call": f"{_state['run']['run_id']}/{call_id}",
                "role": role_cls, "action": action_name}
        token = _current.set(meta)
        t0 = time.time()
        err = None
        text = ""
        try:
            text = await orig_text(self, messages, *args, **kwargs)
            return text
        except BaseException as e:  # record failed calls too, then re-raise
            err = f"{type(e).__name__}: {e}"[:500]
            raise
        finally:
            t1 = time.time()
            _current.reset(token)
            enc = _state["enc"]
            msgs = [{"role": m.get("role", ""), "content": m.get("content", "") if isinstance(m.get("content"), str)
                     else json.dumps(m.get("content"), ensure_ascii=False)} for m in messages]
            rec = {
                "record": RECORD_VERSION,
                **_state["run"],
                "call_id": call_id,
                "role": role_cls,
                "role_name": getattr(role, "name", "") if role is not None else "",
                "role_profile": getattr(role, "profile", "") if role is not None else "",
                "action": action_name,
                "caller": func,
                "attempt": attempt,
                "retry_of": retry_of,
                "parents": parents,
                "t_start": t0,
                "t_end": t1,
                "model": getattr(getattr(self, "config", None), "model", "") or getattr(self, "model", ""),
                "messages": msgs,
                "response": text if isinstance(text, str) else str(text),
                "prompt_tokens": sum(len(enc.encode(m["content"], disallowed_special=())) for m in msgs),
                "completion_tokens": len(enc.encode(text if isinstance(text, str) else str(text), disallowed_special=())),
                "error": err,
            }
            _emit(rec)
            if role is not None:
                st["last"] = call_id

    OpenAILLM.acompletion_text = acompletion_text

    # ---- headers for the offline responder
    try:
        from openai.resources.chat.completions import AsyncCompletions

        orig_create = AsyncCompletions.create

        @functools.wraps(orig_create)
        async def create(self, *args, **kwargs):
            meta = _current.get()
            if meta:
                h = dict(kwargs.get("extra_headers") or {})
                h.update({"X-Topas-Run": meta["run"], "X-Topas-Call": meta["call"], "X-Topas-Role": meta["role"],
                          "X-Topas-Action": meta["action"]})
                kwargs["extra_headers"] = h
            return await orig_create(self, *args, **kwargs)

        AsyncCompletions.create = create
    except Exception:  # pragma: no cover - headers are only a hint
        pass

    # ---- message provenance
    def _note_publish(message) -> None:
        if message is None:
            return
        mid = getattr(message, "id", None)
        if mid is None or mid in _state["msg_src"]:
            return
        role, _a, _f = _caller()
        src = []
        if role is not None:
            last = _role_state(role)["last"]
            if last is not None:
                src = [last]
        _state["msg_src"][mid] = src

    def wrap_publish(cls):
        orig = cls.__dict__.get("publish_message")
        if orig is None:
            return

        @functools.wraps(orig)
        def publish_message(self, message, *args, **kwargs):
            _note_publish(message)
            return orig(self, message, *args, **kwargs)

        cls.publish_message = publish_message

    wrap_publish(Environment)
    try:
        from metagpt.environment.mgx.mgx_env import MGXEnv

        wrap_publish(MGXEnv)
    except ImportError:
        pass

    orig_observe = Role._observe

    @functools.wraps(orig_observe)
    async def _observe(self, *args, **kwargs):
        n = await orig_observe(self, *args, **kwargs)
        st = _role_state(self)
        for m in getattr(self.rc, "news", []) or []:
            for c in _state["msg_src"].get(getattr(m, "id", None), []):
                if c not in st["pending"]:
                    st["pending"].append(c)
        return n

    Role._observe = _observe


def close() -> None:
    fh = _state.pop("fh", None)
    if fh:
        fh.close()
