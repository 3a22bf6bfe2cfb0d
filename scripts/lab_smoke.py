"""Drive JupyterLab in headless Chromium the way a researcher uses it; run before stopping work.

    .venv/bin/python scripts/lab_smoke.py [--out scratch/lab_smoke] [--chromium /usr/bin/chromium]

Needs `make lab`'s environment (JupyterLab) plus Playwright (``.venv/bin/pip install playwright``)
and a Chromium: the system's (``apt-get install chromium``, found on PATH or given with
``--chromium``) or Playwright's own (``.venv/bin/playwright install chromium``).

What it does: starts JupyterLab as ``make lab`` does (the repository root served, ``notebooks/``
opened, notebooks saved without outputs) on a free port; opens ``docs/usage.md`` (reachable from Lab); opens notebook 09, runs
all its cells, moves the beta slider and then the rho slider one step each (keyboard, as a
release), waits for each run and checks the printed report (the setting shown is the slider's,
the change against the start is printed); screenshots each step into ``--out``; saves the
notebook from Lab; and checks that ``git status`` (through the nbstripout filter ``make lab``
installs) is what it was before. Exit status 0 when every check passed; each check prints a line.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "notebooks/09_weights_explorer.ipynb"
#: the clean filter `make lab` installs, given to git here without writing any git config
FILTER = ["-c", f"filter.nbstripout.clean={sys.executable} -m nbstripout --keep-id --extra-keys metadata.language_info", "-c",
          "filter.nbstripout.smudge=cat"]


def git_status() -> str:
    return subprocess.run(["git", *FILTER, "status", "--porcelain"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(port: int, token: str) -> subprocess.Popen:
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter), "lab", "--no-browser", f"--port={port}", "--ServerApp.root_dir=.",
           "--LabApp.default_url=/lab/tree/notebooks", "--ContentsManager.pre_save_hook=topas.notebook_save.strip_outputs",
           f"--IdentityProvider.token={token}"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(120):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise SystemExit("JupyterLab did not answer within 60 s")


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
        self.failed += not ok


def output_text(page) -> str:
    return page.locator(".jp-OutputArea-output").all_inner_texts().__str__()


def wait_for_text(page, text: str, timeout_s: float) -> bool:
    end = time.time() + timeout_s
    while time.time() < end:
        if text in output_text(page):
            return True
        time.sleep(0.5)
    return False


def move_slider(page, label: str, presses: int = 1) -> None:
    """Focus the slider whose description starts with ``label`` and press the right arrow."""
    slider = page.locator(".widget-slider", has=page.locator(".widget-label", has_text=label)).first
    handle = slider.locator(".noUi-handle").first
    handle.focus()
    for _ in range(presses):
        handle.press("ArrowRight")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "scratch" / "lab_smoke", help="screenshots (git-ignored)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                    help="a Chromium executable (default: on PATH, else Playwright's own)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the notebook's first run")
    args = ap.parse_args(argv)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("needs Playwright: .venv/bin/pip install playwright")
    args.out.mkdir(parents=True, exist_ok=True)
    check = Checks()
    before = git_status()
    port, token = free_port(), secrets.token_hex(16)
    lab = start_lab(port, token)
    base = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/docs/usage.md?token={token}")
            try:  # opened as text in Lab's editor
                page.locator(".jp-FileEditor .cm-content", has_text="Using topas").first.wait_for(timeout=240_000)
                opened = True
            except Exception:
                opened = False
            check(opened and "outside root" not in page.content(), "docs/usage.md opens from Lab (repository root served)")
            page.screenshot(path=str(args.out / "0_docs.png"))

            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=240_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            ok = wait_for_text(page, "against the start", args.timeout)
            check(ok, "09 ran: the report under the figure prints the change against the start")
            if not ok:
                page.screenshot(path=str(args.out / "1_failed.png"), full_page=True)
            page.wait_for_selector(".widget-slider", timeout=30_000)
            page.screenshot(path=str(args.out / "1_start.png"), full_page=True)
            for label, want, shot in (("beta", "shown: beta=1.25", "2_beta.png"), ("rho", "rho=0.75", "3_rho.png")):
                t = time.time()
                move_slider(page, label)
                ok = wait_for_text(page, want, 120)
                check(ok, f"{label} moved one step: the figure and report show it ({time.time() - t:.1f} s)")
                page.wait_for_function("() => ![...document.querySelectorAll('.widget-html')]"
                                       ".some(e => e.innerText.includes('running'))", timeout=120_000)
                page.screenshot(path=str(args.out / shot), full_page=True)
            text = output_text(page)
            check("WARNING" in text or "certified capacity" not in text, "overload warning printed where due")
            check("change nothing" in text or "every weight changes" in text, "the inert-weights note is printed")
            page.keyboard.press("Control+s")
            time.sleep(2)
            browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=30)
    check(git_status() == before, "git status unchanged after the session")
    print(f"screenshots in {args.out}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
