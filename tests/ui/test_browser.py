"""JupyterLab with the sandbox extension, driven in Debian's chromium through playwright.

Needs: the built extension (``jupyter_sandbox/labextension``, made by the wheel
build or ``npm run build:prod`` in ``labextension/``), ``pip install playwright``
and ``apt-get install chromium``. No browser is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..helpers import MANAGER, free_port

pytestmark = [pytest.mark.browser, pytest.mark.usefixtures("warm_daemon")]

CHROMIUM = os.environ.get("JUPYTER_SANDBOX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "jupyter_sandbox" / "labextension"
EXT_NAME = "jupyter-sandbox"
KERNEL_DISPLAY = "Python 3 (sandbox: default)"
TIMEOUT_MS = 90_000


def _installed_extension() -> Path | None:
    for base in [Path(sys.prefix), Path(sys.prefix) / "local"]:
        candidate = base / "share" / "jupyter" / "labextensions" / EXT_NAME
        if (candidate / "package.json").exists():
            return candidate
    return None


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    log: Path
    proc: subprocess.Popen[bytes]


@contextmanager
def jupyterlab(tmp_path: Path, *extra: str) -> Iterator[Lab]:
    port = free_port()
    token = uuid.uuid4().hex
    root = tmp_path / "notebooks"
    root.mkdir(exist_ok=True)
    env = dict(os.environ)
    # Fresh settings and workspaces: nothing from a user's own JupyterLab.
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp_path / "lab-settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path / "lab-workspaces")
    if _installed_extension() is None:
        # A development checkout: offer the freshly built extension to JupyterLab.
        data = tmp_path / "data"
        (data / "labextensions").mkdir(parents=True)
        (data / "labextensions" / EXT_NAME).symlink_to(BUILT)
        env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(data), env.get("JUPYTER_PATH")]))
    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    # No "would you like news?" toast over the status bar.
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        filter(None, [str(config), env.get("JUPYTER_CONFIG_PATH")])
    )
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                f"--port={port}",
                "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                f"--ServerApp.kernel_manager_class={MANAGER}",
                "--LabApp.news_url=",
                "--allow-root",
                *extra,
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, root, log, proc)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + log.read_text()) from None
                time.sleep(0.2)
        yield lab
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _requirements() -> str | None:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    if _installed_extension() is None and not (BUILT / "package.json").exists():
        return "the JupyterLab extension is not built (npm run build:prod in labextension/)"
    return None


def run_command(page: Any, label: str) -> None:
    """Run a command through the command palette, as a user would."""
    page.keyboard.press("Control+Shift+C")
    search = page.locator(".lm-CommandPalette-input")
    search.wait_for(state="visible")
    search.fill(label)
    item = page.locator(".lm-CommandPalette-item:not(.lm-mod-disabled)", has_text=label).first
    item.wait_for(state="visible")
    item.click()


def run_cell(page: Any, code: str, expect: str) -> None:
    editor = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content").last
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-OutputArea-output", has_text=expect).first.wait_for(timeout=TIMEOUT_MS)


def launch(page: Any, lab: Lab, section: str = "Sandboxed notebooks") -> Any:
    """Open JupyterLab, start the sandboxed kernel from a launcher section, wait for idle.

    Returns the status bar item.
    """
    from playwright.sync_api import expect

    page.goto(f"{lab.url}/lab?token={lab.token}")
    launcher = page.locator(".jp-Launcher-section", has_text=section)
    launcher.locator(".jp-LauncherCard", has_text=KERNEL_DISPLAY).click()
    status = page.locator(".jp-SandboxStatus")
    expect(status).to_have_attribute("data-sandbox-state", "idle", timeout=TIMEOUT_MS)
    return status


@contextmanager
def lab_in_browser(tmp_path: Path, *extra: str) -> Iterator[tuple[Lab, Any, Path]]:
    """JupyterLab and a chromium page on it: (lab, page, screenshots directory).

    A failure inside leaves a screenshot, the browser console and the server log;
    the browser is closed and the kernels shut down in any case.
    """
    missing = _requirements()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    with jupyterlab(tmp_path, *extra) as lab, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        console: list[str] = []
        page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
        try:
            yield lab, page, shots
        except Exception:
            page.screenshot(path=str(shots / "failure.png"))
            print("browser console:\n" + "\n".join(console[-50:]))
            print("jupyterlab log:\n" + lab.log.read_text(errors="replace")[-5000:])
            raise
        finally:
            context.close()
            _shutdown_kernels(lab)
    print(f"screenshots in {shots}")


def test_notebook_in_a_sandbox_suspend_and_resume(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        page.goto(f"{lab.url}/lab?token={lab.token}")

        # The launcher: sandboxed kernels in their own section, with the sandbox icon.
        section = page.locator(".jp-Launcher-section", has_text="Sandboxed notebooks")
        card = section.locator(".jp-LauncherCard", has_text=KERNEL_DISPLAY)
        card.wait_for()
        assert card.locator("svg").count() >= 1, "the card has no icon"
        # Sandboxed first: above JupyterLab's own (unsandboxed) Notebook section.
        titles = page.locator(".jp-Launcher-section .jp-Launcher-sectionTitle").all_inner_texts()
        assert titles.index("Sandboxed notebooks") < titles.index("Notebook"), titles
        assert titles.index("Sandboxed consoles") < titles.index("Console"), titles
        notebook_section = page.locator(
            ".jp-Launcher-section", has=page.locator("h2", has_text=re.compile("^Notebook$"))
        )
        assert notebook_section.locator(".jp-LauncherCard", has_text="(sandbox:").count() == 0
        logo = page.request.get(f"{lab.url}/kernelspecs/sandbox-default/logo-64x64.png")
        assert logo.ok and logo.headers["content-type"].startswith("image/png")
        page.screenshot(path=str(shots / "01-launcher.png"))

        # Record every state the status bar shows from now on.
        page.evaluate(RECORD_STATES)

        # A notebook on the sandbox kernel: run a cell, see output and state.
        card.click()
        status = page.locator(".jp-SandboxStatus")
        expect(status).to_have_attribute("data-sandbox-state", "idle", timeout=TIMEOUT_MS)
        run_cell(page, "answer = 6 * 7; print(answer)", "42")
        expect(status).to_have_attribute("data-sandbox-state", "idle")
        text = status.inner_text()
        assert "default" in text and "default-" in text, text
        assert any(w in text for w in ("bubblewrap", "not isolated")), text
        page.screenshot(path=str(shots / "02-ran-a-cell.png"))

        # Suspend through the command palette: the status bar says so.
        run_command(page, "Suspend Sandbox")
        expect(status).to_have_attribute("data-sandbox-state", "suspended")
        assert "suspended" in status.inner_text()

        # The side panel lists pools and this kernel as suspended, live.
        page.locator(".lm-TabBar-tab[title='Sandboxes']").first.click()
        sandbox_panel = page.locator("#jupyter-sandbox-panel")
        sandbox_panel.locator("tr[data-pool='default']").wait_for()
        sandbox_panel.locator(".jp-SandboxPanel-kernel[data-sandbox-state='suspended']").wait_for()
        expect(sandbox_panel.locator(".jp-SandboxPanel-live")).to_have_text("● live")
        page.screenshot(path=str(shots / "03-suspended.png"))
        run_command(page, "Show Sandbox Details")
        dialog = page.locator(".jp-Dialog")
        dialog.locator(".jp-SandboxDetails").wait_for()
        assert "In use\tnothing (suspended)" in dialog.inner_text(), dialog.inner_text()
        dialog.locator("button", has_text="Close").click()

        # The next execution resumes the sandbox (a new kernel, same workspace).
        run_cell(page, "import os; print('back in', os.getcwd(), answer)", "back in")
        # Said in words in the cell, not as a "kernel died" dialog, with what came back.
        notice = page.locator(".jp-OutputArea-output", has_text="Resumed after suspension")
        notice.wait_for()
        assert "restored 1 variable" in notice.inner_text(), notice.inner_text()
        # The kernel works in the notebook's own directory.
        back = f"back in {lab.root.resolve()} 42"
        assert page.locator(".jp-OutputArea-output", has_text=back).count()
        assert page.locator(".jp-Dialog", has_text="appears to have died").count() == 0
        expect(status).to_have_attribute("data-sandbox-state", "idle")
        sandbox_panel.locator(".jp-SandboxPanel-kernel[data-sandbox-state='idle']").wait_for()
        page.screenshot(path=str(shots / "04-resumed.png"))

        # Details: workspace, age, resources.
        run_command(page, "Show Sandbox Details")
        dialog = page.locator(".jp-Dialog")
        dialog.locator(".jp-SandboxDetails").wait_for()
        details = dialog.inner_text()
        for word in ("Workspace", "Age", "Process\tpid ", "Isolation", "Claimed"):
            assert word in details, details
        # what it uses now, read from the sandbox when the dialog opens
        assert re.search(r"Memory in use\t\d+ MB", details), details
        assert re.search(r"CPU now\t\d+% of a core", details), details
        labels = dialog.locator(".jp-SandboxDetails th").all_inner_texts()
        assert not [label for label in labels if "_" in label], labels
        page.screenshot(path=str(shots / "05-details.png"))
        dialog.locator("button", has_text="Close").click()

        states = _dedupe(page.evaluate("window.__sandboxStates"))
        print("status bar states:", " -> ".join(states))
        assert _in_order(states, ["claiming", "idle", "suspended", "idle"]), states


def test_a_console_on_a_sandbox_kernel(tmp_path: Path) -> None:
    """A console gets what a notebook gets: status item, Kernel menu commands, panel entry."""
    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        status = launch(page, lab, "Sandboxed consoles")
        prompt = page.locator(".jp-CodeConsole-promptCell .cm-content")
        prompt.click()
        page.keyboard.type("print(6 * 7)")
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-CodeConsole .jp-OutputArea-output", has_text="42").wait_for()

        # The Kernel menu's sandbox commands act on the console's kernel.
        page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
        suspend = page.locator(".lm-Menu-item", has_text="Suspend Sandbox")
        expect(suspend).not_to_have_attribute("aria-disabled", "true")
        page.screenshot(path=str(shots / "01-console-kernel-menu.png"))
        suspend.click()
        expect(status).to_have_attribute("data-sandbox-state", "suspended", timeout=TIMEOUT_MS)

        # The panel names it as JupyterLab does ("Console 1"), not by its session id.
        page.locator(".lm-TabBar-tab[title='Sandboxes']").first.click()
        entry = page.locator("#jupyter-sandbox-panel .jp-SandboxPanel-kernel").first
        entry.wait_for()
        name = entry.locator(".jp-SandboxPanel-kernelName").inner_text()
        assert name.startswith("Console"), name
        assert "console-" not in name, name
        # Buttons on one line; the disabled one looks disabled.
        buttons = entry.locator(".jp-SandboxPanel-actions button")
        tops = {round(box["y"]) for box in (b.bounding_box() for b in buttons.all()) if box}
        assert len(tops) == 1, tops
        suspend_button = buttons.filter(has_text="Suspend")
        assert suspend_button.is_disabled()
        opacity = suspend_button.evaluate("b => getComputedStyle(b).opacity")
        assert float(opacity) < 1, opacity
        page.screenshot(path=str(shots / "02-console-in-panel.png"))

        # The next execution resumes it, with its variables.
        prompt.click()
        page.keyboard.type("print('back', 6 * 7)")
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-CodeConsole .jp-OutputArea-output", has_text="back 42").wait_for()
        expect(status).to_have_attribute("data-sandbox-state", "idle")


RECORD_STATES = """() => {
  window.__sandboxStates = [];
  const seen = () => {
    const item = document.querySelector('.jp-SandboxStatus');
    if (item) window.__sandboxStates.push(item.getAttribute('data-sandbox-state'));
  };
  new MutationObserver(seen).observe(document.body, {
    subtree: true, attributes: true, attributeFilter: ['data-sandbox-state']
  });
}"""


def _dedupe(states: list[str]) -> list[str]:
    out: list[str] = []
    for state in states:
        if not out or out[-1] != state:
            out.append(state)
    return out


def _in_order(states: list[str], wanted: list[str]) -> bool:
    position = 0
    for state in states:
        if position < len(wanted) and state == wanted[position]:
            position += 1
    return position == len(wanted)


def test_a_copy_mode_notebook_gets_its_files_back_on_demand(tmp_path: Path) -> None:
    """Copy mode from JupyterLab: inputs are there, the command brings outputs back."""
    import nbformat
    from nbformat.v4 import new_notebook
    from playwright.sync_api import expect

    from jupyter_sandbox.kernelspec import install_kernelspec

    from ..conftest import ROOT

    display = "Python 3 (sandbox: default, files: copy)"  # the default name says the mode
    install_kernelspec("default", prefix=str(ROOT), name="sandbox-copy", files="copy")
    with lab_in_browser(tmp_path) as (lab, page, shots):
        folder = lab.root / "project"
        folder.mkdir()
        (folder / "data.csv").write_text("a\n21\n")
        nb = new_notebook()
        nb.metadata["kernelspec"] = {
            "name": "sandbox-copy",
            "display_name": display,
            "language": "python",
        }
        nbformat.write(nb, folder / "analysis.ipynb")
        page.goto(f"{lab.url}/lab/tree/project/analysis.ipynb?token={lab.token}")
        status = page.locator(".jp-SandboxStatus")
        expect(status).to_have_attribute("data-sandbox-state", "idle", timeout=TIMEOUT_MS)
        run_cell(
            page,
            "x = int(open('data.csv').read().split()[1]); print('read', x); "
            "open('twice.txt', 'w').write(str(2 * x))",
            "read 21",
        )
        assert not (folder / "twice.txt").exists(), "a copy, not a mount"
        run_command(page, "Copy Sandbox Files Back")
        toast = page.locator(".Toastify__toast", has_text="copied back")
        toast.wait_for()
        assert "1 file(s) copied back" in toast.inner_text(), toast.inner_text()
        assert (folder / "twice.txt").read_text() == "42"
        page.screenshot(path=str(shots / "20-copied-back.png"))
        run_command(page, "Show Sandbox Details")
        dialog = page.locator(".jp-Dialog")
        dialog.locator(".jp-SandboxDetails").wait_for()
        details = dialog.inner_text()
        assert f"copied from {folder.resolve()}" in details, details
        assert "Last copied back" in details, details
        page.screenshot(path=str(shots / "21-details-copy-mode.png"))
        dialog.locator("button", has_text="Close").click()


def test_the_sandbox_files_panel_browses_opens_and_uploads(tmp_path: Path) -> None:
    """The workspace of the focused notebook's sandbox in JupyterLab's own file browser."""
    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        launch(page, lab)
        run_cell(
            page,
            "import os; home = os.path.expanduser('~'); os.makedirs(f'{home}/results', "
            "exist_ok=True); open(f'{home}/results/table.csv', 'w').write('a,b\\n1,2\\n'); "
            "print('wrote', home)",
            "wrote",
        )
        page.locator(".lm-TabBar-tab[title^='Sandbox Files']").first.click()
        workspace = page.locator("#jupyter-sandbox-workspace")
        header = workspace.locator(".jp-SandboxWorkspace-header")
        expect(header).to_contain_text("Untitled.ipynb")
        # Bound (the default): the notebook's own files are not here, and it says so.
        expect(header).to_contain_text("is bound into the sandbox, so its files are in the file")
        listing = workspace.locator(".jp-DirListing-content")
        folder = listing.locator(".jp-DirListing-item", has_text="results")
        folder.wait_for()
        folder.dblclick()
        listing.locator(".jp-DirListing-item", has_text="table.csv").dblclick()
        # Opened in JupyterLab's CSV viewer, from the sandbox.
        page.locator(".lm-TabBar-tab", has_text="table.csv").wait_for()
        page.screenshot(path=str(shots / "30-sandbox-files.png"))

        # Upload into the sandbox; the kernel sees the file.
        upload = tmp_path / "uploaded.txt"
        upload.write_text("from the browser")
        with page.expect_file_chooser() as chooser:
            workspace.locator(".jp-ToolbarButtonComponent[title^='Upload']").click()
        chooser.value.set_files(str(upload))
        listing.locator(".jp-DirListing-item", has_text="uploaded.txt").wait_for()
        page.locator(".lm-TabBar-tab", has_text="Untitled.ipynb").first.click()
        run_cell(
            page,
            "print('sees', open(f'{home}/results/uploaded.txt').read())",
            "sees from the browser",
        )
        page.screenshot(path=str(shots / "31-uploaded.png"))


def test_the_sandbox_files_panel_asks_the_sandbox_only_while_shown(tmp_path: Path) -> None:
    """It polled every 10 s whether shown or not (three server warnings a poll for a
    suspended sandbox); now it asks only while it shows a sandbox's files."""
    with lab_in_browser(tmp_path) as (lab, page, shots):
        listings: list[str] = []
        page.on(
            "request",
            lambda r: (
                listings.append(r.url)
                if "/api/sandbox/kernels/" in r.url and "/contents" in r.url
                else None
            ),
        )
        launch(page, lab)
        page.wait_for_timeout(22_000)  # two poll intervals with the panel hidden
        assert listings == [], listings
        page.locator(".lm-TabBar-tab[title^='Sandbox Files']").first.click()
        workspace = page.locator("#jupyter-sandbox-workspace")
        workspace.locator(".jp-DirListing-content").wait_for()
        page.wait_for_timeout(2_000)
        assert listings, "the shown panel lists the workspace at once"
        page.screenshot(path=str(shots / "01-shown.png"))


def test_a_culled_notebook_reopens_without_a_crash_dialog(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    culling = (
        "--MappingKernelManager.cull_idle_timeout=6",
        "--MappingKernelManager.cull_interval=1",
        "--MappingKernelManager.cull_connected=True",
    )
    with lab_in_browser(tmp_path, *culling) as (lab, page, shots):
        (lab.root / "data.csv").write_text("a\n20\n")
        status = launch(page, lab)
        run_cell(page, "x = int(open('data.csv').read().split()[1]); print('read', x)", "read 20")

        # With the tab open, the idle kernel is culled: suspended, and a toast says so.
        expect(status).to_have_attribute("data-sandbox-state", "suspended", timeout=60_000)
        toast = page.locator(".Toastify__toast", has_text="suspended while idle")
        toast.wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(shots / "10-culled-with-tab-open.png"))

        # Reload: the notebook reconnects to the suspended kernel, which resumes;
        # no "kernel appears to have died" dialog, the variables are back.
        page.reload()
        page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=TIMEOUT_MS)
        run_cell(page, "print('doubled', x * 2)", "doubled 40")
        notice = page.locator(".jp-OutputArea-output", has_text="Resumed after suspension")
        notice.wait_for()
        assert "restored" in notice.inner_text(), notice.inner_text()
        assert page.locator(".jp-Dialog", has_text="appears to have died").count() == 0
        assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()
        # The notice is output, not an error box.
        assert notice.get_attribute("data-mime-type") == "application/vnd.jupyter.stdout"
        page.screenshot(path=str(shots / "11-reopened-after-cull.png"))

        # "Shut Down Kernel": the status bar no longer says anything (it used to
        # stay on "claiming…" forever).
        page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
        page.locator(".lm-Menu-itemLabel", has_text="Shut Down Kernel").first.click()
        confirm = page.locator(".jp-Dialog button", has_text="Shut Down")
        if confirm.count():
            confirm.first.click()
        expect(status).to_have_attribute("data-sandbox-state", "none", timeout=TIMEOUT_MS)
        page.wait_for_timeout(2000)  # and stays so
        assert status.get_attribute("data-sandbox-state") == "none"
        page.screenshot(path=str(shots / "12-kernel-shut-down.png"))


def test_a_failed_claim_is_explained(tmp_path: Path) -> None:
    """Pool not found: said once, with what to do; the status bar gives the advice."""
    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        page.goto(f"{lab.url}/lab?token={lab.token}")
        section = page.locator(".jp-Launcher-section", has_text="Sandboxed notebooks")
        section.locator(".jp-LauncherCard", has_text="(sandbox: missing)").click()
        status = page.locator(".jp-SandboxStatus")
        expect(status).to_have_attribute("data-sandbox-state", "failed")
        assert "does not exist" in (status.get_attribute("title") or "")
        # JupyterLab's own "Error Starting Kernel" dialog says it, with the hint ...
        dialog = page.locator(".jp-Dialog", has_text="Error Starting Kernel")
        dialog.wait_for()
        assert "jupyter-sandbox pool create missing" in dialog.inner_text()
        assert "HTTP 404" not in dialog.inner_text(), dialog.inner_text()
        # ... and only it: no second copy in a toast, no progress toast left behind.
        page.wait_for_timeout(1000)
        expect(page.locator(".Toastify__toast", has_text="does not exist")).to_have_count(0)
        expect(page.locator(".jp-Notification-Toast-in-progress")).to_have_count(0)
        page.screenshot(path=str(shots / "01-pool-not-found.png"))
        page.locator(".jp-Dialog button", has_text="Ok").first.click()
        page.locator(".jp-Dialog button", has_text="No Kernel").first.click()
        page.locator(".jp-Dialog").first.wait_for(state="detached")
        # The red status item gives the advice.
        expect(status).to_have_attribute("data-sandbox-state", "failed")
        status.click()
        advice = page.locator(".jp-Dialog", has_text="could not be claimed")
        advice.wait_for()
        assert "Create the pool" in advice.inner_text()
        page.screenshot(path=str(shots / "02-what-to-do.png"))


def test_a_workspace_over_its_disk_limit_shows_in_the_status_bar(tmp_path: Path) -> None:
    """At the pool's disk_mb (a full image as root, a measured excess as an ordinary
    user) the status bar warns, its tooltip says what to do, and the warning goes
    once files are deleted."""
    import asyncio

    from playwright.sync_api import expect

    from jupyter_sandbox.kernelspec import install_kernelspec

    from ..conftest import ROOT
    from ..helpers import apply_pool

    enforced = os.geteuid() == 0  # a root daemon's workspaces are images of disk_mb
    asyncio.run(apply_pool("tinydisk", {"replicas": 0, "disk_mb": 5}))
    install_kernelspec("tinydisk", prefix=str(ROOT))
    try:
        with lab_in_browser(tmp_path) as (lab, page, shots):
            page.goto(f"{lab.url}/lab?token={lab.token}")
            section = page.locator(".jp-Launcher-section", has_text="Sandboxed notebooks")
            section.locator(".jp-LauncherCard", has_text="(sandbox: tinydisk)").click()
            status = page.locator(".jp-SandboxStatus")
            expect(status).to_have_attribute("data-sandbox-state", "idle", timeout=TIMEOUT_MS)
            # As root the workspace is a 5 MB filesystem: the writes stop there.
            run_cell(
                page,
                "import contextlib, os\n"
                "with contextlib.suppress(OSError): [f.write(os.urandom(1 << 16)) "
                "for f in [open('/workspace/big', 'wb', buffering=0)] for _ in range(128)]\n"
                "print('ok')",
                "ok",
            )
            warning = status.locator(".jp-SandboxStatus-disk")
            expect(warning).to_have_text("⚠ disk full", timeout=30_000)
            title = status.get_attribute("title") or ""
            said = "workspace is full" if enforced else "over its disk limit"
            assert said in title and "delete files in /workspace" in title, title
            # ... and said once in a notification that stays until dismissed
            toast = page.locator(".Toastify__toast", has_text=said)
            toast.wait_for()
            page.screenshot(path=str(shots / "01-disk-full.png"))
            page.wait_for_timeout(2000)
            expect(toast).to_have_count(1)
            run_command(page, "Show Sandbox Details")
            dialog = page.locator(".jp-Dialog")
            dialog.locator(".jp-SandboxDetails").wait_for()
            details = dialog.inner_text()
            reached = r", enforced \(full\)" if enforced else r" \(over the limit\)"
            assert re.search(rf"Workspace disk\t[\d.]+ MB of 5 MB{reached}", details), details
            page.screenshot(path=str(shots / "02-details.png"))
            dialog.locator("button", has_text="Close").click()
            run_cell(page, "os.remove('/workspace/big'); print('removed')", "removed")
            expect(warning).to_have_count(0, timeout=30_000)
            page.screenshot(path=str(shots / "03-room-again.png"))
    finally:
        asyncio.run(apply_pool("tinydisk", None))


def test_suspending_a_busy_kernel_asks_first(tmp_path: Path) -> None:
    """Suspend clicked while a cell runs: JupyterLab asks, and "Keep running" lets
    the cell finish with its output and the kernel's variables."""
    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        status = launch(page, lab)
        run_cell(page, "kept = 41; print('set')", "set")
        editor = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content").last
        editor.click()
        page.keyboard.press("Control+a")
        page.keyboard.type("import time; time.sleep(8); kept += 1; print('finished', kept)")
        page.keyboard.press("Shift+Enter")
        expect(status).to_have_attribute("data-sandbox-state", "busy", timeout=30_000)
        run_command(page, "Suspend Sandbox")
        dialog = page.locator(".jp-Dialog", has_text="The kernel is running a cell")
        dialog.wait_for()
        assert "Suspend anyway" in dialog.inner_text()
        page.screenshot(path=str(shots / "01-asks.png"))
        dialog.locator("button", has_text="Keep running").click()
        page.locator(".jp-OutputArea-output", has_text="finished 42").wait_for(timeout=TIMEOUT_MS)
        expect(status).to_have_attribute("data-sandbox-state", "idle")
        assert page.locator(".jp-Notification-Toast-error").count() == 0
        page.screenshot(path=str(shots / "02-cell-finished.png"))


def _shutdown_kernels(lab: Lab) -> None:
    import urllib.request

    headers = {"Authorization": f"token {lab.token}"}
    request = urllib.request.Request(f"{lab.url}/api/kernels", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        kernels = json.loads(response.read())
    for kernel in kernels:
        delete = urllib.request.Request(
            f"{lab.url}/api/kernels/{kernel['id']}", headers=headers, method="DELETE"
        )
        urllib.request.urlopen(delete, timeout=60).close()


def test_the_debugger_stops_at_a_breakpoint_in_a_sandboxed_notebook(tmp_path: Path) -> None:
    """JupyterLab's visual debugger on a sandboxed kernel: enabled from the
    notebook's toolbar, a breakpoint set in the gutter stops the cell there, the
    variables panel shows the sandbox's values, and Continue finishes the cell."""
    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        launch(page, lab)
        notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        bug = notebook.locator(".jp-DebuggerBugButton")
        bug.click()
        expect(bug).to_have_attribute("aria-pressed", "true", timeout=TIMEOUT_MS)
        editor = notebook.locator(".jp-Cell .cm-content").last
        editor.click()
        page.keyboard.type("x = 20\ny = x + 22\nprint('done', y)")
        # a breakpoint on line 2: a click in the breakpoint gutter beside it
        line = notebook.locator(".jp-Cell .cm-line").nth(1).bounding_box()
        gutter = notebook.locator(".jp-Cell .cm-breakpoint-gutter").last.bounding_box()
        assert line and gutter
        page.mouse.click(gutter["x"] + gutter["width"] / 2, line["y"] + line["height"] / 2)
        page.screenshot(path=str(shots / "01-breakpoint.png"))
        page.keyboard.press("Shift+Enter")
        frame = page.locator(".jp-DebuggerCallstackFrame").first
        frame.wait_for(timeout=TIMEOUT_MS)
        variables = page.locator(".jp-DebuggerVariables-body.jp-debuggerVariables-local")
        expect(variables).to_contain_text("x", timeout=TIMEOUT_MS)
        expect(variables).to_contain_text("20")
        page.screenshot(path=str(shots / "02-stopped.png"))
        run_command(page, "Continue")
        page.locator(".jp-OutputArea-output", has_text="done 42").wait_for(timeout=TIMEOUT_MS)
        page.screenshot(path=str(shots / "03-continued.png"))


def test_an_idle_notebook_hears_before_its_sandbox_is_suspended(tmp_path: Path) -> None:
    """Before the idle cull suspends a sandbox, JupyterLab says so; "Keep running"
    counts as activity and the sandbox stays; left alone, it is suspended as said.
    (A 60 s timeout: the notice comes a quarter of it before, at most 5 minutes;
    the page checks every 10 s, so it shows with at least 5 s to go.)"""
    from playwright.sync_api import expect

    culling = (
        "--MappingKernelManager.cull_idle_timeout=60",
        "--MappingKernelManager.cull_interval=5",
        "--MappingKernelManager.cull_connected=True",
    )
    with lab_in_browser(tmp_path, *culling) as (lab, page, shots):
        status = launch(page, lab)
        run_cell(page, "kept = 'still here'; print('set')", "set")
        notice = page.locator(".jp-Notification-Toast-warning", has_text="has been idle")
        notice.wait_for(timeout=90_000)
        assert "will be suspended" in notice.inner_text()
        page.screenshot(path=str(shots / "01-notice.png"))
        notice.locator("button", has_text="Keep running").click()
        expect(notice).to_have_count(0)
        # past the first deadline: still running, since the click was activity
        page.wait_for_timeout(20_000)
        expect(status).to_have_attribute("data-sandbox-state", "idle")
        # left alone: the notice again, then the suspend it announced
        notice.wait_for(timeout=90_000)
        expect(status).to_have_attribute("data-sandbox-state", "suspended", timeout=60_000)
        expect(notice).to_have_count(0, timeout=20_000)
        page.screenshot(path=str(shots / "02-suspended.png"))
        run_cell(page, "print(kept)", "still here")


def test_the_status_bar_meters_the_sandboxs_memory(tmp_path: Path) -> None:
    """The status bar shows what the focused notebook's sandbox uses now: 300 MB
    held by the kernel show within a few seconds; suspended, the meter goes."""
    import re

    from playwright.sync_api import expect

    with lab_in_browser(tmp_path) as (lab, page, shots):
        status = launch(page, lab)
        meter = status.locator(".jp-SandboxStatus-meter")
        expect(meter).to_have_text(re.compile(r"^\d+ MB · \d+% CPU$"), timeout=30_000)
        run_cell(page, "held = b'x' * (300 * 1024 * 1024); print('held')", "held")

        def megabytes() -> float:
            text = meter.inner_text()
            number = float(re.match(r"([\d.]+)", text).group(1))  # type: ignore[union-attr]
            return number * 1024 if " GB" in text else number

        deadline = time.monotonic() + 30
        while megabytes() < 300 and time.monotonic() < deadline:
            page.wait_for_timeout(500)
        assert megabytes() >= 300, meter.inner_text()
        assert "Now: " in (status.get_attribute("title") or "")
        page.screenshot(path=str(shots / "01-meter.png"))
        run_command(page, "Suspend Sandbox")
        expect(status).to_have_attribute("data-sandbox-state", "suspended", timeout=TIMEOUT_MS)
        expect(meter).to_have_count(0)


def test_notebooks_opened_at_once_share_one_start_toast(tmp_path: Path) -> None:
    """A restored workspace opens several notebooks at once: their cold starts
    show as one progress toast and one outcome, never a stack of toasts."""
    import asyncio

    from jupyter_sandbox.kernelspec import install_kernelspec

    from ..conftest import ROOT
    from ..helpers import apply_pool

    asyncio.run(apply_pool("coldthree", {"replicas": 0}))
    install_kernelspec("coldthree", prefix=str(ROOT))
    spec = {"name": "sandbox-coldthree", "display_name": "cold", "language": "python"}
    notebook = {"cells": [], "metadata": {"kernelspec": spec}, "nbformat": 4, "nbformat_minor": 5}
    paths = ["one.ipynb", "two.ipynb", "three.ipynb"]
    try:
        with lab_in_browser(tmp_path, "--LabApp.expose_app_in_browser=True") as (lab, page, shots):
            for path in paths:
                (lab.root / path).write_text(json.dumps(notebook))
            page.goto(f"{lab.url}/lab?token={lab.token}")
            page.wait_for_function("window.jupyterapp && window.jupyterapp.started")
            page.evaluate(
                "paths => paths.forEach(path =>"
                " window.jupyterapp.commands.execute('docmanager:open', {path}))",
                paths,
            )
            most = {"in-progress": 0, "success": 0}
            seen: list[str] = []
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                for kind in most:
                    toasts = page.locator(f".jp-Notification-Toast-{kind}")
                    most[kind] = max(most[kind], toasts.count())
                    seen += [t for t in toasts.all_inner_texts() if t not in seen]
                if len(_idle_kernels(lab)) == 3 and most["success"]:
                    break
                page.wait_for_timeout(100)
            page.screenshot(path=str(shots / "01-three-ready.png"))
            assert len(_idle_kernels(lab)) == 3
            assert most == {"in-progress": 1, "success": 1}, (most, seen)
            assert any("Starting 3 sandboxed kernels" in t for t in seen), seen
            assert any("3 sandboxes ready (3 cold start)" in t for t in seen), seen
    finally:
        asyncio.run(apply_pool("coldthree", None))


def _idle_kernels(lab: Lab) -> list[str]:
    import urllib.request

    headers = {"Authorization": f"token {lab.token}"}
    request = urllib.request.Request(f"{lab.url}/api/kernels", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return [k["id"] for k in json.loads(response.read()) if k["execution_state"] == "idle"]


def test_pip_packages_stay_with_the_project_after_a_restart(tmp_path: Path) -> None:
    """%pip in a notebook, JupyterLab stopped and started again: the project's next
    kernel imports the package at once, another project's does not, and Sandbox
    Details says where the packages are kept and how to put them in a pool."""
    import nbformat
    from nbformat.v4 import new_notebook
    from playwright.sync_api import expect

    from ..test_packages import PACKAGE, build_wheel

    def notebook(folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        nb = new_notebook()
        nb.metadata["kernelspec"] = {
            "name": "sandbox-default",
            "display_name": KERNEL_DISPLAY,
            "language": "python",
        }
        nbformat.write(nb, folder / name)

    def open_notebook(page: Any, lab: Lab, path: str) -> None:
        page.goto(f"{lab.url}/lab/tree/{path}?token={lab.token}")
        current = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
        expect(current).to_contain_text(Path(path).name, timeout=TIMEOUT_MS)
        status = page.locator(".jp-SandboxStatus")
        expect(status).to_have_attribute("data-sandbox-state", "idle", timeout=TIMEOUT_MS)
        expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")).to_have_count(1)

    first = tmp_path / "first"
    first.mkdir()
    project = first / "notebooks" / "analysis"
    notebook(project, "one.ipynb")
    wheel = build_wheel(project)
    with lab_in_browser(first) as (lab, page, shots):
        open_notebook(page, lab, "analysis/one.ipynb")
        run_cell(page, f"%pip install --no-index {wheel.name}", "Successfully installed")
        run_command(page, "Show Sandbox Details")
        dialog = page.locator(".jp-Dialog")
        dialog.locator(".jp-SandboxDetails").wait_for()
        details = dialog.inner_text()
        assert "%pip packages\tkept for this project in" in details, details
        assert "--requirements" in details, details
        page.screenshot(path=str(shots / "01-kept-for-the-project.png"))
        dialog.locator("button", has_text="Close").click()

    # JupyterLab again, on a root that holds the same project (by its real path).
    second = tmp_path / "second"
    (second / "notebooks").mkdir(parents=True)
    (second / "notebooks" / "analysis").symlink_to(project)
    notebook(second / "notebooks" / "other", "x.ipynb")
    notebook(project, "two.ipynb")
    with lab_in_browser(second) as (lab, page, shots):
        open_notebook(page, lab, "analysis/two.ipynb")
        run_cell(page, f"import {PACKAGE}; print('found:', {PACKAGE}.VALUE)", "found: installed")
        page.screenshot(path=str(shots / "02-still-there.png"))
        open_notebook(page, lab, "other/x.ipynb")
        run_cell(page, f"import {PACKAGE}", "ModuleNotFoundError")
        page.screenshot(path=str(shots / "03-not-in-another-project.png"))


def test_the_sandbox_terminal_runs_in_the_notebooks_sandbox(tmp_path: Path) -> None:
    """The launcher's Sandbox Terminal opens a shell inside the focused notebook's
    sandbox: it sees the notebook's files and what the kernel wrote, not the
    host's; with no sandboxed kernel running it says what to do instead."""
    from playwright.sync_api import expect

    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's secret\n")
    with lab_in_browser(tmp_path) as (lab, page, shots):
        page.goto(f"{lab.url}/lab?token={lab.token}")
        card = page.locator(".jp-LauncherCard", has_text="Sandbox Terminal")
        card.click()
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text("No sandboxed kernel is running")
        page.screenshot(path=str(shots / "01-no-kernel-yet.png"))
        dialog.locator("button", has_text="Close").click()

        launch(page, lab)
        run_cell(page, "open('from-kernel.txt', 'w').write('kernel was here'); print('ok')", "ok")
        run_command(page, "Open a Terminal in the Sandbox")
        tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current")
        expect(tab).to_contain_text("Terminal in sandbox", timeout=TIMEOUT_MS)
        terminal = page.locator(".jp-SandboxTerminal .jp-Terminal")
        terminal.wait_for()
        terminal.click()
        report = lab.root / "terminal-report.txt"
        page.keyboard.type(
            f"(id -u; pwd; cat from-kernel.txt; echo; cat {secret} 2>&1; echo code=$?)"
            " > terminal-report.txt\n"
        )
        deadline = time.monotonic() + 30
        while "code=" not in (report.read_text() if report.exists() else ""):
            assert time.monotonic() < deadline, "the terminal's command did not run"
            time.sleep(0.2)
        lines = report.read_text().splitlines()
        assert lines[2] == "kernel was here", lines
        assert "the host's secret" not in report.read_text(), lines
        assert lines[-1] == "code=1", lines
        page.keyboard.type("ls\n")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shots / "02-terminal-in-the-sandbox.png"))
