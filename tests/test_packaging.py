"""Packaging consistency: pyproject.toml, environment.yml, the Makefile and .ci/run agree.

environment.yml is read with a minimal line parser (below) rather than PyYAML, so this test
needs no dependency beyond the standard library. The parser handles exactly the shape of that
file: top-level ``key: value`` / ``key:`` lines, ``- item`` lists under them, and one nested
``- pip:`` list. A file it cannot read makes the test fail loudly rather than guess.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Entries of environment.yml that are not packages of ours.
ENV_IGNORED = {"python", "pip"}
# The pyproject extras that environment.yml mirrors (besides the core dependencies).
MIRRORED_EXTRAS = ("test", "notebooks")

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_LOWER_BOUND = re.compile(r">=\s*([0-9][0-9A-Za-z.]*)")


def normalise(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(requirement: str) -> str:
    """Normalised package name of a PEP 508 requirement or a conda match spec."""
    m = _NAME.match(requirement)
    assert m, f"cannot read a package name from {requirement!r}"
    return normalise(m.group(1))


def lower_bound(requirement: str) -> str | None:
    m = _LOWER_BOUND.search(requirement)
    return m.group(1) if m else None


def read_env_yml(path: Path) -> dict:
    """Read the simple environment.yml: returns {key: str | list}, the pip list under 'pip'."""
    data: dict = {}
    key = None  # the current top-level key holding a list
    in_pip = False  # inside the nested `- pip:` list
    pip_indent = -1
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        text = line.strip()
        if indent == 0:
            in_pip = False
            k, sep, v = text.partition(":")
            assert sep, f"{path.name}:{lineno}: expected 'key: value', got {raw!r}"
            v = v.strip()
            if v:
                data[k.strip()] = v
                key = None
            else:
                key = k.strip()
                data[key] = []
            continue
        assert text.startswith("- "), f"{path.name}:{lineno}: expected a '- item', got {raw!r}"
        item = text[2:].strip().strip("'\"")
        if in_pip and indent > pip_indent:
            data["pip"].append(item)
        elif item == "pip:":
            in_pip, pip_indent = True, indent
            data.setdefault("pip", [])
        else:
            assert key is not None, f"{path.name}:{lineno}: list item outside a list: {raw!r}"
            in_pip = False
            data[key].append(item)
    return data


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pyproject_requirements() -> list[str]:
    project = pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in MIRRORED_EXTRAS:
        reqs += project["optional-dependencies"][extra]
    return reqs


def env_requirements() -> list[str]:
    env = read_env_yml(ROOT / "environment.yml")
    conda = [d for d in env["dependencies"] if req_name(d) not in ENV_IGNORED]
    pip = [p for p in env.get("pip", []) if not p.startswith("-e")]
    return conda + pip


def test_env_yml_reader_handles_the_file_shape():
    env = read_env_yml(ROOT / "environment.yml")
    assert env["name"] == "topas"
    assert "conda-forge" in env["channels"]
    assert any(d.startswith("python=3.11") for d in env["dependencies"])
    assert "-e ." in env["pip"], "environment.yml must install topas itself with pip: -e ."


def test_environment_yml_matches_pyproject_names():
    want = {req_name(r) for r in pyproject_requirements()}
    have = {req_name(r) for r in env_requirements()}
    only_py = sorted(want - have)
    only_env = sorted(have - want)
    assert want == have, (
        "environment.yml and pyproject.toml (core + "
        + " + ".join(MIRRORED_EXTRAS)
        + " extras) list different packages.\n"
        f"  in pyproject.toml only:  {only_py or '-'}\n"
        f"  in environment.yml only: {only_env or '-'}"
    )


def test_environment_yml_matches_pyproject_lower_bounds():
    want = {req_name(r): lower_bound(r) for r in pyproject_requirements()}
    have = {req_name(r): lower_bound(r) for r in env_requirements()}
    diffs = [
        f"  {n}: pyproject >={want[n]}, environment.yml >={have[n]}"
        for n in sorted(want.keys() & have.keys())
        if want[n] != have[n]
    ]
    assert not diffs, "lower bounds differ:\n" + "\n".join(diffs)


def test_core_deps_exclude_gpu_stack():
    core = {req_name(r) for r in pyproject()["project"]["dependencies"]}
    assert not core & {"torch", "sglang", "metagpt"}, "GPU/agent stacks must stay optional extras"


def test_makefile_installs_existing_extras():
    extras = set(pyproject()["project"]["optional-dependencies"])
    makefile = (ROOT / "Makefile").read_text()
    used = {e for group in re.findall(r"\.\[([a-z,]+)\]", makefile) for e in group.split(",")}
    assert used, "the Makefile installs no extras"
    assert used <= extras, f"Makefile installs unknown extras: {sorted(used - extras)}"


def test_ci_run_invokes_make_test():
    path = ROOT / ".ci" / "run"
    lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    assert any(re.fullmatch(r"(exec\s+)?make\s+test", ln) for ln in lines), (
        ".ci/run must run `make test` (the README's test command)"
    )
    assert path.stat().st_mode & 0o111, ".ci/run must be executable"


# ----------------------------------------------------------------------------- the lock file

LOCK = ROOT / "requirements-lock.txt"


def read_lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for lineno, raw in enumerate(LOCK.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and ";" not in line and " @ " not in line, (
            f"{LOCK.name}:{lineno}: not a plain name==version pin from PyPI: {raw!r}")
        pins[normalise(name)] = version
    return pins


def test_lock_pins_every_dependency_of_the_default_environment():
    """`make install` installs pyproject's core + test/notebooks/ray extras under the lock's pins;
    every one of them (and the libraries the results record) must be pinned, at or above its
    lower bound."""
    pins = read_lock()
    project = pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in ("test", "notebooks", "ray"):
        reqs += project["optional-dependencies"][extra]
    for r in reqs:
        name = req_name(r)
        assert name in pins, f"{name} is not pinned in {LOCK.name} (run `make lock`)"
        low = lower_bound(r)
        if low:
            as_tuple = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:3])  # noqa: E731
            assert as_tuple(pins[name]) >= as_tuple(low), f"{name}=={pins[name]} is below {r}"
    assert "topas" not in pins, "the lock must not pin topas itself (it is installed editable)"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"pip install -c \$\(LOCK\) -e '\.\[test,notebooks,ray\]'", makefile)
    assert "LOCK ?= requirements-lock.txt" in makefile


def test_make_help_is_aligned_and_lab_runs_as_root():
    import subprocess

    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("  ")]
    assert len(rows) > 10
    cols = {len(ln) - len(ln[2:].split(" ", 1)[1].lstrip()) for ln in rows}
    assert len(cols) == 1, f"make help descriptions start at columns {sorted(cols)}:\n{out}"
    lab = subprocess.run(["make", "-n", "lab", "ARGS=--no-browser --port 8890"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    cmd = [ln for ln in lab.splitlines() if "jupyter lab" in ln]
    assert cmd and cmd[-1].endswith("--no-browser --port 8890")
    import os

    assert ("--allow-root" in cmd[-1]) == (os.getuid() == 0)


def test_pytest_addopts_leave_the_summary_line():
    """`make test ARGS="-x -q"` must still print pytest's summary line: -q in addopts would make it -qq."""
    addopts = pyproject()["tool"]["pytest"]["ini_options"].get("addopts", "")
    assert "-q" not in addopts.split()


# ----------------------------------------------------------------------------- installed without data/


def test_a_copy_without_data_says_how_to_point_at_it(tmp_path):
    """A wheel carries the code only: `topas simulate` then names $TOPAS_DATA instead of listing
    "(none)", and works once $TOPAS_DATA points at a clone's data/."""
    import os
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "topas", tmp_path / "site" / "topas", ignore=shutil.ignore_patterns("__pycache__"))
    cmd = [sys.executable, "-m", "topas.cli", "simulate", "--trace", "dag-4", "--policy", "fcfs",
           "--tasks", "3", "--load", "1", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "TOPAS_DATA"}
    env["PYTHONPATH"] = str(tmp_path / "site")
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "TOPAS_DATA" in r.stderr and "wheel" in r.stderr and "(none)" not in r.stderr
    r = subprocess.run(cmd, env={**env, "TOPAS_DATA": str(ROOT / "data")}, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "JCT (s)" in r.stdout


def test_make_lab_is_its_own_small_pinned_extra_at_the_repository_root():
    """`make lab` installs the notebooks + lab extras only (no Ray), every one pinned in the lock,
    serves the repository root with notebooks/ opened, and installs nbstripout as the git filter."""
    import subprocess

    pins = read_lock()
    lab = pyproject()["project"]["optional-dependencies"]["lab"]
    assert {req_name(r) for r in lab} >= {"jupyterlab", "nbstripout"}
    assert all(req_name(r) in pins for r in lab), "pin the lab extra in the lock (make lock)"
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -c $(LOCK) -e '.[notebooks,lab]'" in makefile
    dry = subprocess.run(["make", "-n", "-W", "pyproject.toml", "lab"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "ray" not in dry.replace("--ServerApp", "")
    cmd = [ln for ln in dry.splitlines() if "jupyter lab" in ln][-1]
    assert "--ServerApp.root_dir=." in cmd and "--LabApp.default_url=/lab/tree/notebooks" in cmd
    assert "--ContentsManager.pre_save_hook=topas.notebook_save.strip_outputs" in cmd
    assert "cd notebooks" not in dry
    assert "nbstripout --install" in dry and "nbstripout --keep-id --extra-keys metadata.language_info" in dry
    assert "*.ipynb filter=nbstripout" in (ROOT / ".gitattributes").read_text()
