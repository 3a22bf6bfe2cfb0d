#!/usr/bin/env python
"""Run MetaGPT software teams on a list of requirements, record every LLM call, convert to traces.

Runs with a MetaGPT venv's Python (``make metagpt-env`` builds them; never the package's .venv):

    # MetaGPT-SOP (metagpt==0.8.2), offline responder on 127.0.0.1, 60 requirements:
    .venvs/metagpt-sop/bin/python scripts/collect_metagpt_traces.py --workflow sop --offline --n 150
    # MetaGPT-TL (MetaGPT main @ METAGPT_TL_COMMIT) against an OpenAI-compatible server (e.g. SGLang):
    .venvs/metagpt-tl/bin/python scripts/collect_metagpt_traces.py --workflow tl \\
        --base-url http://gpu-box:30000/v1 --model Qwen/Qwen2.5-32B-Instruct --n 150
    # only re-convert the committed calls (data/traces/metagpt_W.calls.jsonl.xz) into the trace:
    .venvs/metagpt-sop/bin/python scripts/collect_metagpt_traces.py --workflow sop --convert-only

Requirements run in child processes, ``--batch-size`` of them one after another per process
(importing MetaGPT costs more CPU than a run with the offline responder), ``--jobs`` processes at a
time; each process has its own ``METAGPT_PROJECT_ROOT`` (holding ``config/config2.yaml``: api_type openai, base_url, model,
api_key) and ``HOME`` (so no ``~/.metagpt/config2.yaml`` of the user can override it), under a
wall-clock limit. ``tools/metagpt/recorder.py`` records the calls (no MetaGPT source is edited).
Outputs, for workflow W in {sop, tl}:

- ``data/traces/metagpt_W.calls.jsonl.xz``: every recorded call of every completed run
  (format: tools/metagpt/README.md), runs in requirement order;
- ``data/traces/metagpt_W.runs.json``: one entry per attempted run (requirement, status, seconds,
  calls, tokens) and the collection settings;
- ``data/traces/metagpt-W.json.gz``: the ``topas.trace/1`` trace (``topas.workload.metagpt``).

Without ``--offline`` nothing is modelled: output lengths are the model's real answers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import lzma
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools" / "metagpt"
TRACES = REPO / "data" / "traces"

#: MetaGPT versions. SOP: the PyPI release; TL: MetaGPT's main branch (TeamLeader mode is in no release).
METAGPT_SOP_VERSION = "0.8.2"
METAGPT_TL_COMMIT = "1dfce070d29041fbd10dc9deb4a2db48bd5aebc7"  # FoundationAgents/MetaGPT, 2025-06-30

WORKFLOWS = {
    "sop": {"trace": "metagpt-sop", "venv": ".venvs/metagpt-sop", "metagpt": f"metagpt=={METAGPT_SOP_VERSION}",
            "n_round": 12},
    "tl": {"trace": "metagpt-tl", "raw_trace": "metagpt-tl-raw", "venv": ".venvs/metagpt-tl", "metagpt": f"MetaGPT main@{METAGPT_TL_COMMIT[:8]}",
           "n_round": 30},
}

# Nominal arrival rates (meta.rate of the traces): topas.workload.metagpt.NOMINAL_RATES.


def read_requirements(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(root: Path, base_url: str, model: str, api_key: str, stream: bool) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "config2.yaml").write_text(
        "llm:\n"
        "  api_type: openai\n"
        f"  base_url: {json.dumps(base_url)}\n"
        f"  api_key: {json.dumps(api_key)}\n"
        f"  model: {json.dumps(model)}\n"
        f"  stream: {'true' if stream else 'false'}\n"
        "  timeout: 600\n",
        encoding="utf-8",
    )


# ----------------------------------------------------------------------------- the child: one run


def run_batch(args) -> int:
    """Inside a child process: record the MetaGPT runs of requirements ``args.batch`` one after
    another (importing MetaGPT costs ~15 s of CPU, more than a run with the offline responder).
    Each run writes ``<calls-dir>/r<index>.jsonl`` and one line to ``<calls-dir>/status.jsonl``."""
    sys.path.insert(0, str(TOOLS))
    import recorder  # tools/metagpt/recorder.py

    reqs = read_requirements(args.requirements)
    wf = WORKFLOWS[args.workflow]
    out = Path(args.calls_out)
    from metagpt.software_company import generate_repo

    if args.workflow == "sop" and args.offline:
        # QaEngineer pip-installs requirements.txt and pytest before each test run; the offline
        # responder's code and tests need only the standard library (its package lists are
        # empty), so skip the installs: same LLM calls, less wall time
        from metagpt.actions.run_code import RunCode

        RunCode._install_dependencies = staticmethod(lambda working_directory, env: None)
    for i in [int(x) for x in args.batch.split(",")]:
        idea = reqs[i]
        run = {
            "run_id": f"{args.workflow}-r{i:03d}",
            "workflow": wf["trace"],
            "requirement_index": i,
            "requirement": idea,
            "metagpt": wf["metagpt"],
            "endpoint": "offline-responder" if args.offline else args.base_url,
        }
        recorder.start_run(str(out / f"r{i:03d}.jsonl"), run)
        t0 = time.time()
        status = "ok"
        try:
            if args.workflow == "sop":
                # the paper's 5-role SOP: PM, Architect, ProjectManager, Engineer (code review), QaEngineer
                generate_repo(idea, investment=1000.0, n_round=args.n_round or wf["n_round"], code_review=True,
                              run_tests=True, implement=True)
            else:
                # MetaGPT main's generate_repo hires the TeamLeader organisation (TeamLeader,
                # ProductManager, Architect, Engineer2, DataAnalyst) in an MGXEnv
                generate_repo(idea, investment=1000.0, n_round=args.n_round or wf["n_round"])
        except Exception as e:  # record and go on with the next requirement
            status = f"failed ({type(e).__name__}: {e})"[:300]
        recorder.close()
        with open(out / "status.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"index": i, "status": status, "wall_s": round(time.time() - t0, 2)}) + "\n")
    return 0


# ----------------------------------------------------------------------------- the parent


def collect(args) -> None:
    wf = WORKFLOWS[args.workflow]
    reqs = read_requirements(args.requirements)
    idx = list(range(args.start, min(len(reqs), args.start + args.n)))
    work = Path(args.workdir or tempfile.mkdtemp(prefix=f"metagpt-{args.workflow}-"))
    work.mkdir(parents=True, exist_ok=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    responder = None
    base_url, model, api_key = args.base_url, args.model, args.api_key
    if args.offline:
        port = free_port()
        responder = subprocess.Popen([sys.executable, str(TOOLS / "responder.py"), "--port", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base_url, model, api_key = f"http://127.0.0.1:{port}/v1", "gpt-4-turbo", "sk-offline"
        time.sleep(1.0)
    if not base_url:
        sys.exit("give --base-url (an OpenAI-compatible endpoint) or --offline")
    runs_path = args.out_dir / f"metagpt_{args.workflow}.runs.json"
    runs = json.loads(runs_path.read_text()) if (args.resume and runs_path.exists()) else {"runs": []}
    done = {r["requirement_index"] for r in runs["runs"] if r["status"] == "ok"}
    env_base = dict(os.environ)
    env_base["TIKTOKEN_CACHE_DIR"] = str(Path(args.tiktoken_cache).resolve())
    env_base.setdefault("PYTHONUNBUFFERED", "1")
    lock = threading.Lock()

    def one(batch: list[int]) -> None:
        bdir = work / f"b{batch[0]:03d}"
        shutil.rmtree(bdir, ignore_errors=True)
        (bdir / "home").mkdir(parents=True)
        (bdir / "calls").mkdir()
        write_config(bdir, base_url, model, api_key, stream=args.stream)
        env = dict(env_base, METAGPT_PROJECT_ROOT=str(bdir), HOME=str(bdir / "home"))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--workflow", args.workflow,
               "--batch", ",".join(map(str, batch)), "--calls-out", str(bdir / "calls"),
               "--requirements", str(args.requirements)]
        cmd += ["--offline"] if args.offline else ["--base-url", base_url]
        if args.n_round:
            cmd += ["--n-round", str(args.n_round)]
        with open(bdir / "log.txt", "wb") as log:
            try:
                rc = subprocess.run(cmd, env=env, cwd=bdir, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=args.timeout * len(batch)).returncode
                why = f"process exit {rc}"
            except subprocess.TimeoutExpired:
                why = f"batch timeout after {args.timeout * len(batch)} s"
        st_path = bdir / "calls" / "status.jsonl"
        statuses = {}
        if st_path.exists():
            for line in st_path.read_text().splitlines():
                d = json.loads(line)
                statuses[d["index"]] = d
        for i in batch:
            calls = bdir / "calls" / f"r{i:03d}.jsonl"
            st = statuses.get(i, {"status": f"failed ({why})", "wall_s": None})
            status = st["status"]
            recs = [json.loads(l) for l in calls.read_text(encoding="utf-8").splitlines() if l.strip()] \
                if calls.exists() else []
            if status == "ok" and not recs:
                status = "failed (no LLM calls recorded)"
            entry = {"run_id": f"{args.workflow}-r{i:03d}", "requirement_index": i, "requirement": reqs[i],
                     "status": status, "wall_s": st["wall_s"], "calls": len(recs),
                     "retries": sum(1 for r in recs if r.get("attempt", 1) > 1),
                     "errors": sum(1 for r in recs if r.get("error")),
                     "prompt_tokens": sum(r["prompt_tokens"] for r in recs),
                     "completion_tokens": sum(r["completion_tokens"] for r in recs)}
            with lock:
                runs["runs"] = [r for r in runs["runs"] if r["requirement_index"] != i] + [entry]
                runs["runs"].sort(key=lambda r: r["requirement_index"])
                runs["settings"] = settings
                runs_path.write_text(json.dumps(runs, indent=1) + "\n")
                if status == "ok":
                    args.raw_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copy(calls, args.raw_dir / f"{entry['run_id']}.jsonl")
                print(f"[{time.strftime('%H:%M:%S')}] {entry['run_id']}: {status}, {len(recs)} calls, "
                      f"{entry['prompt_tokens'] + entry['completion_tokens']} tokens, {st['wall_s']} s", flush=True)
        if not args.keep_workdir:
            shutil.rmtree(bdir / "workspace", ignore_errors=True)

    settings = {"workflow": args.workflow, "metagpt": wf["metagpt"],
                "endpoint": "offline-responder (tools/metagpt/responder.py)" if args.offline else base_url,
                "model": model, "stream": args.stream, "n_round": args.n_round or wf["n_round"],
                "timeout_s": args.timeout, "requirements": str(args.requirements.relative_to(REPO))
                if args.requirements.is_relative_to(REPO) else str(args.requirements)}

    try:
        todo = [i for i in idx if i not in done]
        # round-robin batches, so each worker process walks the list in order
        nb = max(1, math.ceil(len(todo) / max(1, args.batch_size)))
        batches = [todo[k::nb] for k in range(nb)]
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as ex:
            for f in [ex.submit(one, b) for b in batches if b]:
                f.result()
    finally:
        if responder is not None:
            responder.terminate()
            responder.wait(10)


def bundle(args) -> Path:
    """All completed runs' calls -> data/traces/metagpt_W.calls.jsonl.xz (requirement order)."""
    runs = json.loads((args.out_dir / f"metagpt_{args.workflow}.runs.json").read_text())
    out = args.out_dir / f"metagpt_{args.workflow}.calls.jsonl.xz"
    lines = []
    for r in runs["runs"]:
        if r["status"] != "ok":
            continue
        lines += [l for l in (args.raw_dir / f"{r['run_id']}.jsonl").read_text(encoding="utf-8").splitlines()
                  if l.strip()]
    # xz, not gzip: TL-mode prompts repeat system prompts of 10-40 kB, beyond gzip's 32 kB window
    # (17.6 MB as .gz, 0.7 MB as .xz for 150 TL runs)
    out.write_bytes(lzma.compress(("\n".join(lines) + "\n").encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    return out


def convert(args, calls_path: Path) -> Path:
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(Path(args.tiktoken_cache).resolve()))
    from topas.workload.metagpt import NOMINAL_RATES, convert_file
    from topas.workload.trace_io import write_trace

    wf = WORKFLOWS[args.workflow]
    # the masked trace (volatile values normalised away) and, for TL, whose RoleZero prompts carry
    # the current time, the variant a deployment sees: one distinct second per call
    variants = [(wf["trace"], "masked")] + ([(wf["raw_trace"], "distinct")] if "raw_trace" in wf else [])
    for name, time in variants:
        trace = convert_file(calls_path, name=name, rate=NOMINAL_RATES[name], encoding="cl100k_base", time=time)
        out = write_trace(trace, args.out_dir / f"{name}.json.gz")
        print(f"wrote {out}: {len(trace.tasks)} tasks, {trace.num_requests} requests, {len(trace.agents)} agents")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--workflow", choices=sorted(WORKFLOWS), required=True)
    ap.add_argument("--requirements", type=Path, default=TOOLS / "requirements_softwaredev.txt")
    ap.add_argument("--n", type=int, default=150, help="number of requirements to run (from --start)")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--offline", action="store_true", help="start tools/metagpt/responder.py on 127.0.0.1 and use it")
    ap.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", ""))
    ap.add_argument("--model", default=os.environ.get("METAGPT_MODEL", "gpt-4-turbo"))
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "sk-none"))
    ap.add_argument("--stream", action="store_true", help="stream answers (MetaGPT's default; off here: same calls)")
    ap.add_argument("--n-round", type=int, default=0, help="MetaGPT team rounds (default: per workflow)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at the same time (each is its own process)")
    ap.add_argument("--timeout", type=int, default=900, help="wall-clock limit per run (s)")
    ap.add_argument("--out-dir", type=Path, default=TRACES)
    ap.add_argument("--raw-dir", type=Path, default=REPO / ".metagpt-runs" / "calls",
                    help="per-run call records (bundled into data/traces/metagpt_W.calls.jsonl.xz)")
    ap.add_argument("--workdir", default="", help="where runs happen (default: a new temp dir)")
    ap.add_argument("--keep-workdir", action="store_true", help="keep the generated repositories")
    ap.add_argument("--resume", action="store_true", help="skip requirements already recorded ok in runs.json")
    ap.add_argument("--tiktoken-cache", default=str(REPO / ".venvs" / "tiktoken_cache"))
    ap.add_argument("--convert-only", action="store_true",
                    help="only convert data/traces/metagpt_W.calls.jsonl.xz (the committed calls) into the trace")
    ap.add_argument("--no-convert", action="store_true")
    ap.add_argument("--batch-size", type=int, default=12, help="requirements per MetaGPT process")
    ap.add_argument("--batch", default="", help=argparse.SUPPRESS)
    ap.add_argument("--calls-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.requirements = args.requirements.resolve()
    args.out_dir = args.out_dir.resolve()
    if args.batch:
        sys.exit(run_batch(args))
    if not args.convert_only:
        collect(args)
        calls = bundle(args)
    else:  # the committed bundle: works on a fresh clone (the per-run records are not committed)
        calls = args.out_dir / f"metagpt_{args.workflow}.calls.jsonl.xz"
    if not args.no_convert:
        convert(args, calls)


if __name__ == "__main__":
    main()
