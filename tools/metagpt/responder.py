#!/usr/bin/env python
"""An offline OpenAI-compatible chat server for MetaGPT runs on machines without an LLM (stdlib only).

    python tools/metagpt/responder.py --port 8399            # serves http://127.0.0.1:8399/v1

It answers ``POST /v1/chat/completions`` (plain and ``stream=true``) and ``GET /v1/models`` with
*well-formed* output of a modelled length, so that real MetaGPT code runs end to end and produces
real call structures and real prompts:

- ActionNode calls (the prompt carries a ``[CONTENT]`` format example): a ``[CONTENT]{json}[/CONTENT]``
  answer with exactly the example's keys and JSON types; long strings and lists are filled with
  words; ``File list`` / ``Task list`` / ``Logic Analysis`` name the project's code files (their
  number drawn by the length model, mean 5.1); short enum-like values are kept from the example;
- code calls (WriteCode, rewrite after LBTM, WriteTest, DebugError): one fenced Python block of
  valid, quickly-running code (MetaGPT's QA really runs the tests);
- WriteCodeReview: a short review ending ``## Code Review Result\\nLGTM`` (or ``LBTM`` with the
  model's probability, which makes MetaGPT ask for a rewrite); RunCode: ``PASS`` / ``NoOne``;
  Engineer's is-pass probe: ``YES``;
- TeamLeader-mode RoleZero turns: a ```json command list (see :func:`rolezero_answer`).

Which action a call belongs to comes from the ``X-Topas-Action`` header the recorder adds (and from
the prompt when absent); the length comes from ``length_model.output_tokens(action, call key)``.
Words are common English words, ~1 cl100k token each, so the requested length is approximate;
the recorder counts the real tokens. With probability ``length_model.P_BAD_JSON`` an ActionNode
answer is malformed on purpose (missing closing brace): MetaGPT then retries the call, as it does
with a real model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import length_model as lm  # noqa: E402

WORDS = (
    "the user game player score board data file module class function value system design list "
    "state update check input output screen level time simple clean fast test error result main "
    "logic event handle display render record store load save config option menu start stop reset "
    "move turn rule play win lose next previous first last new old good clear small large easy "
    "should will can must provide support allow keep make use show give read write build run call "
    "return create define manage track handle apply ensure follow select open close add remove"
).split()

FILE_STEMS = (
    "game board player score ui storage utils config models views controller engine api "
    "database auth handlers services renderer input_handler level timer menu"
).split()


def words(n: int, key: str) -> str:
    """``n`` words (about ``n`` tokens), deterministic in ``key``."""
    h = hashlib.sha256(key.encode()).digest()
    out = []
    for i in range(max(1, n)):
        out.append(WORDS[(h[i % 32] + 7 * i + i * i) % len(WORDS)])
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


def file_names(k: int, key: str) -> list[str]:
    h = hashlib.sha256(key.encode()).digest()
    stems: list[str] = []
    i = 0
    while len(stems) < k - 1:
        s = FILE_STEMS[(h[i % 32] + i) % len(FILE_STEMS)]
        if s not in stems:
            stems.append(s)
        i += 1
    return ["main.py"] + [f"{s}.py" for s in stems]


def python_code(n_tokens: int, key: str, filename: str = "main.py") -> str:
    """Valid, quickly-running Python of about ``n_tokens`` tokens (each function ~30 tokens)."""
    n_funcs = max(1, n_tokens // 30)
    lines = [f'"""{filename}: {words(8, key + "doc")}"""', ""]
    for i in range(n_funcs):
        lines += [
            "",
            f"def step_{i}(value: int = {i}) -> int:",
            f'    """{words(6, f"{key}f{i}")}"""',
            f"    return value * 2 + {i}",
        ]
    lines += ["", "", 'if __name__ == "__main__":', "    print(step_0(1))", ""]
    return "\n".join(lines)


def test_code(n_tokens: int, key: str) -> str:
    n = max(1, n_tokens // 30)
    lines = ["import unittest", "", "", "class TestGenerated(unittest.TestCase):"]
    for i in range(n):
        lines += [f"    def test_case_{i}(self) -> None:", f'        """{words(5, f"{key}t{i}")}"""',
                  f"        self.assertEqual({i} * 2, {2 * i})", ""]
    lines += ["", 'if __name__ == "__main__":', "    unittest.main()", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- ActionNode JSON

KEEP_KEYS = {"Language", "Programming Language"}
#: package lists are answered empty: MetaGPT's QA pip-installs them before running tests
EMPTY_KEYS = {"Required packages", "Required Python packages", "Required Other language third-party packages"}


def _example_json(prompt: str) -> dict | None:
    """The JSON of the last ``[CONTENT]...[/CONTENT]`` format example in the prompt."""
    blocks = re.findall(r"\[CONTENT\]\s*(\{.*?\})\s*\[/CONTENT\]", prompt, re.DOTALL)
    for b in reversed(blocks):
        try:
            v = json.loads(b)
        except json.JSONDecodeError:
            continue
        if isinstance(v, dict):
            return v
    return None


def _context_files(prompt: str) -> list[str] | None:
    """Files named by an earlier design (``"File list": [...]``) in the prompt's context."""
    context = prompt.split("## format example")[0]  # never the format example's own file list
    for key in ("Task list", "File list"):
        for m in re.finditer(rf'"{key}"\s*:\s*(\[[^\]]*\])', context):
            try:
                files = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if files and all(isinstance(f, str) for f in files):
                return files
    return None


def _count_strings(v) -> int:
    if isinstance(v, str):
        return 1 if len(v.split()) > 1 else 0
    if isinstance(v, list):
        return sum(_count_strings(x) for x in v)
    if isinstance(v, dict):
        return sum(_count_strings(x) for x in v.values())
    return 0


def _fill(v, per: int, key: str, name: str):
    if isinstance(v, str):
        if len(v.split()) <= 1:  # enum-like values (P0, BUG, en_us, Python): kept
            return v
        first = v.strip().splitlines()[0].strip() if v.strip() else ""
        if first in ("classDiagram", "sequenceDiagram", "quadrantChart") or first.startswith("```"):
            return first + "\n" + "\n".join("    " + words(10, f"{key}{i}") for i in range(max(1, per // 10)))
        return words(per, key)
    if isinstance(v, list):
        return [_fill(x, per, f"{key}/{i}", name) for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {k: _fill(x, per, f"{key}/{k}", k) for k, x in v.items()}
    return v


def action_node_answer(prompt: str, action: str, key: str, project: str) -> str:
    example = _example_json(prompt)
    if example is None:
        return words(lm.output_tokens(action, key), key)
    if set(example) <= {"Issue Type", "is_relative", "Is Relative", "reason", "Reason"} or len(example) <= 2:
        # small probes (is this a bug fix? is it related to the old PRD?): answer "no" the way MetaGPT expects
        out = {}
        for k, v in example.items():
            if k == "Issue Type":
                out[k] = "REQUIREMENT"
            elif k.lower() in ("is_relative", "is relative"):
                out[k] = "NO" if isinstance(v, str) else False
            else:
                out[k] = _fill(v, 10, f"{key}/{k}", k)
        body = out
    else:
        total = lm.output_tokens(action, key)
        n = max(1, _count_strings(example))
        per = max(3, total // n)
        files = _context_files(prompt) or file_names(lm.n_files(project), project)
        body = {}
        for k, v in example.items():
            if k in ("File list", "Task list"):
                body[k] = list(files)
            elif k == "Logic Analysis":
                body[k] = [[f, words(max(4, per // 2), f"{key}/la/{f}")] for f in files]
            elif k == "Project Name":
                body[k] = "project_" + hashlib.sha256(project.encode()).hexdigest()[:6]
            elif k in KEEP_KEYS:
                body[k] = v
            elif k in EMPTY_KEYS:
                body[k] = []
            else:
                body[k] = _fill(v, per, f"{key}/{k}", k)
    text = json.dumps(body, indent=2, ensure_ascii=False)
    if lm.bernoulli(lm.P_BAD_JSON, "bad|" + key) and len(body) > 2:
        text = text.rstrip().rstrip("}")  # malformed on purpose: MetaGPT retries the call
    return f"[CONTENT]\n{text}\n[/CONTENT]"


# ----------------------------------------------------------------------------- TeamLeader mode

#: MetaGPT main's default names (metagpt/roles/...): TeamLeader Mike, ProductManager Alice,
#: Architect Bob, Engineer2 Alex, DataAnalyst David.
TL_PIPELINE = (("Alice", "Write a PRD for the requirement"), ("Bob", "Write a system design from the PRD"),
               ("Alex", "Write the code from the system design"))


def _requirement(prompt: str) -> str:
    m = re.search(r"\[Message\] from User to [^:]*: (.*?)(?:\n|$)", prompt)
    return m.group(1).strip() if m else "the user requirement"


def rolezero_commands(prompt: str, role: str, key: str, project: str, n_words: int) -> list[dict]:
    """The next commands of a RoleZero role, decided from the conversation in the prompt.

    A modelled team that follows MetaGPT's TL_INSTRUCTION standard process (main's generate_repo
    hires no ProjectManager): TeamLeader plans three tasks and routes them one at a time,
    Alice (PRD, through the WritePRD tool) -> Bob (system design, written with Editor.write) ->
    Alex (one Engineer2.write_new_code per code file, then done); after each member reports back
    the TeamLeader finishes the current task and routes the next; at the end it replies and ends.
    Every member reports with RoleZero.reply_to_human and ends.
    """
    req = _requirement(prompt)
    reply = {"command_name": "RoleZero.reply_to_human", "args": {"content": words(max(5, n_words // 3), key + "r")}}
    if role == "TeamLeader":
        senders = set(re.findall(r"\[Message\] from (\w+)[ (]", prompt))  # "from Alice(Product Manager) to Mike"
        done = [name for name, _ in TL_PIPELINE if name in senders]
        k = len(done)
        cmds: list[dict] = []
        if k == 0:
            for i, (name, what) in enumerate(TL_PIPELINE):
                cmds.append({"command_name": "Plan.append_task",
                             "args": {"task_id": str(i + 1), "dependent_task_ids": [str(i)] if i else [],
                                      "instruction": f"{what}: {req}", "assignee": name}})
        else:
            cmds.append({"command_name": "Plan.finish_current_task", "args": {}})
        if k < len(TL_PIPELINE):
            name, what = TL_PIPELINE[k]
            cmds.append({"command_name": "TeamLeader.publish_team_message",
                         "args": {"content": f"{what}. Requirement: {req}. {words(max(5, n_words // 3), key + 'm')}",
                                  "send_to": name}})
            cmds.append(reply)
        else:
            cmds += [reply, {"command_name": "end"}]
        return cmds
    if role == "ProductManager":
        if "Command WritePRD.run executed" in prompt:
            return [reply, {"command_name": "end"}]
        return [{"command_name": "WritePRD.run", "args": {"user_requirement": req}}]
    if role == "Architect":
        if "Command Editor.write executed" in prompt:
            return [reply, {"command_name": "end"}]
        design = words(lm.output_tokens("WriteDesign", key + "d"), key + "d")
        return [{"command_name": "Editor.write", "args": {"path": "docs/system_design.md", "content": design}}]
    if role == "Engineer2":
        files = file_names(lm.n_files(project), project)
        written = prompt.count("Command Engineer2.write_new_code executed")
        if written < len(files):
            return [{"command_name": "Engineer2.write_new_code",
                     "args": {"path": f"src/{files[written]}", "file_description": words(12, key + "f")}}]
        return [reply, {"command_name": "end"}]
    return [reply, {"command_name": "end"}]


def rolezero_answer(prompt: str, role: str, action: str, key: str, project: str) -> str:
    """A RoleZero turn: a short thought and a ```json list of commands."""
    n = lm.output_tokens("RoleZero.think", key)
    cmds = rolezero_commands(prompt, role, key, project, n)
    return f"{words(max(5, n // 3), key)}\n```json\n{json.dumps(cmds, indent=2)}\n```"


# ----------------------------------------------------------------------------- dispatch


def classify(prompt: str, action: str) -> str:
    if "provide the appropriate response category: QUICK, SEARCH, TASK, or AMBIGUOUS" in prompt:
        return "intent"
    if "Which Natural Language must you respond in?" in prompt:
        return "language"
    if "# Available Commands" in prompt and "command_name" in prompt:
        return "rolezero"
    if "[CONTENT]" in prompt and "[/CONTENT]" in prompt:
        return "action_node"
    if "Code Review Result" in prompt and "LGTM" in prompt and "# Instruction: rewrite" not in prompt:
        return "review"
    if "# Instruction: rewrite" in prompt:
        return "rewrite"
    if "summarize the code running result" in prompt or action == "RunCode":
        return "run_code"
    if "Does the above log indicate anything that needs to be done" in prompt:
        return "is_pass"
    if "## Code Review All" in prompt and "## TODOs" in prompt:
        return "summarize"
    if "unittest framework" in prompt or action == "WriteTest":
        return "test"
    if action in ("WriteCode", "DebugError") or "## Code:" in prompt or "```python\n## " in prompt:
        return "code"
    if "code is absolutely required" in prompt:  # Engineer2.write_new_code
        return "new_code"
    return "text"


def answer(messages: list[dict], headers) -> str:
    prompt = "\n".join(str(m.get("content", "")) for m in messages)
    action = headers.get("X-Topas-Action") or ""
    role = headers.get("X-Topas-Role") or ""
    key = headers.get("X-Topas-Call") or hashlib.sha256(prompt.encode()).hexdigest()
    project = headers.get("X-Topas-Run") or key
    kind = classify(prompt, action)
    fn = (re.findall(r"## Code: ([\w./-]+)", prompt) or re.findall(r"rewrite the `([\w./-]+)`", prompt) or ["main.py"])[-1]
    if kind == "intent":
        return f"Thought: {words(12, key)}\nResponse Category: TASK"
    if kind == "language":
        return "English"
    if kind == "action_node":
        return action_node_answer(prompt, action or "default", key, project)
    if kind == "review":
        n = lm.output_tokens("WriteCodeReview", key)
        verdict = "LBTM" if lm.bernoulli(lm.P_LBTM, "lbtm|" + key) else "LGTM"
        return (f"## Code Review: {fn}\n1. {words(n // 3, key + 'a')}\n2. {words(n // 3, key + 'b')}\n\n"
                f"## Actions\n1. {words(max(3, n // 3 - 10), key + 'c')}\n\n## Code Review Result\n{verdict}\n")
    if kind == "rewrite":
        n = lm.output_tokens("WriteCodeReview.rewrite", key)
        return f"## Code: {fn}\n```python\n{python_code(n, key, fn)}\n```\n"
    if kind == "run_code":
        n = lm.output_tokens("RunCode", key)
        return (f"---\n## instruction:\n{words(max(3, n - 20), key)}\n## File To Rewrite:\nNone\n"
                f"## Status:\nPASS\n## Send To:\nNoOne\n---\n")
    if kind == "is_pass":
        return '```json\n{"status": "YES"}\n```\nYES'
    if kind == "summarize":
        n = lm.output_tokens("SummarizeCode", key)
        q = max(3, n // 4)
        return (f"## Code Review All\n\n### {fn}\n- {words(q, key + 'a')}\n\n## Call flow\n```mermaid\nsequenceDiagram\n"
                f"    participant M as Main\n    M->>M: {words(q, key + 'b')}\n```\n\n## Summary\n{words(q, key + 'c')}\n\n"
                f"## TODOs\n```python\n{{}}\n```\n")
    if kind == "test":
        n = lm.output_tokens("WriteTest", key)
        return f"```python\n{test_code(n, key)}\n```\n"
    if kind == "code":
        n = lm.output_tokens(action or "WriteCode", key)
        return f"## Code: {fn}\n```python\n{python_code(n, key, fn)}\n```\n"
    if kind == "new_code":
        fn = (re.findall(r"Your task is to write the ([\w./-]+)", prompt) or ["main.py"])[-1]
        n = lm.output_tokens("WriteCode", key)
        return f"{words(10, key)}\n```python\n{python_code(n, key, fn)}\n```\n"
    if kind == "rolezero":
        return rolezero_answer(prompt, role, action or "RoleZero.think", key, project)
    return words(lm.output_tokens(action or "default", key), key)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "topas-metagpt-responder/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _send_json(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self._send_json({"object": "list", "data": [{"id": "offline-responder", "object": "model"}]})
        else:
            self._send_json({"status": "ok"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(n) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_json({"error": {"message": f"unknown path {self.path}"}}, 404)
            return
        try:
            text = answer(req.get("messages") or [], self.headers)
        except Exception as e:  # never kill the server; MetaGPT sees an error and retries
            self._send_json({"error": {"message": f"responder failed: {e!r}"}}, 500)
            return
        model = req.get("model", "offline-responder")
        created = int(time.time())
        cid = "chatcmpl-" + hashlib.sha256(text.encode()).hexdigest()[:24]
        usage = {"prompt_tokens": 0, "completion_tokens": len(text.split()), "total_tokens": len(text.split())}
        if not req.get("stream"):
            self._send_json({"id": cid, "object": "chat.completion", "created": created, "model": model,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "stop", "logprobs": None}], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        pieces = [text[i:i + 2000] for i in range(0, len(text), 2000)] or [""]
        for i, p in enumerate(pieces):
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [{"index": 0, "delta": ({"role": "assistant"} if i == 0 else {}) | {"content": p},
                                  "finish_reason": None, "logprobs": None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        last = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}], "usage": usage}
        self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def serve(port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8399)
    a = ap.parse_args()
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    print(f"responder on http://{a.host}:{a.port}/v1", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
