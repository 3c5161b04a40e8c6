"""The JupyterLab path from chromium: JupyterLab's own kernel connection in a page.

JupyterLab runs with the sandbox kernel manager and its application exposed in
the page (``--LabApp.expose_app_in_browser``). In headless chromium, the page
starts a sandboxed kernel and a plain ipykernel through JupyterLab's service
manager and times, with ``performance.now()``, each ``requestExecute(...).done``:
from the request leaving JupyterLab's kernel connection to the kernel's reply
and its idle status arriving, which is when a notebook shows the cell as done.
No rendering is timed (a frame is 16 ms, far more than the path itself).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from tornado import httpclient

from .server_path import Server
from .stats import Figure, Series

CHROMIUM = os.environ.get("JUPYTER_SANDBOX_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

PAGE_HELPERS = """
() => {
  window.__bench = {};
  window.__benchStart = async (name) => {
    const kernel = await window.jupyterapp.serviceManager.kernels.startNew({ name });
    await kernel.info;
    window.__bench[name] = kernel;
    return kernel.id;
  };
  window.__benchRun = async (name, count, code) => {
    const kernel = window.__bench[name];
    const times = [];
    for (let i = 0; i < count; i++) {
      const started = performance.now();
      const reply = await kernel.requestExecute({ code, store_history: false }).done;
      if (reply.content.status !== 'ok') throw new Error(`${name}: ${reply.content.status}`);
      times.push(performance.now() - started);
    }
    return times;
  };
}
"""


def unavailable_reason() -> str | None:
    """Why the chromium figure cannot be measured here, or None."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return "JupyterLab is not installed"
    return None


async def browser_round_trip(
    sandbox_kernel: str, plain_kernel: str, reps: int, settle: Callable[[], Awaitable[None]]
) -> Figure:
    """`pass` from JupyterLab's kernel connection in chromium, sandboxed vs plain."""
    from playwright.async_api import async_playwright

    settings = tempfile.mkdtemp(prefix="bench-lab-settings-")
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": os.path.join(settings, "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": os.path.join(settings, "workspaces"),
    }
    lab = Server("jupyterlab", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", env=env)
    try:
        await lab.wait_up()
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            try:
                page = await browser.new_page()
                await page.goto(f"{lab.url}/lab?token={lab.token}")
                await page.wait_for_function(
                    "() => window.jupyterapp && window.jupyterapp.serviceManager", timeout=120_000
                )
                await page.evaluate("() => window.jupyterapp.restored")
                await page.evaluate(PAGE_HELPERS)
                for name in (sandbox_kernel, plain_kernel):
                    await page.evaluate("(name) => window.__benchStart(name)", name)
                await settle()
                sandbox, plain = Series("sandbox", "ms"), Series("plain ipykernel", "ms")
                for name in (sandbox_kernel, plain_kernel):  # warm both paths up
                    await _run(page, name, 5)
                for _ in range(max(1, reps // 10)):
                    sandbox.values += await _run(page, sandbox_kernel, 10)
                    plain.values += await _run(page, plain_kernel, 10)
            finally:
                await browser.close()
    finally:
        try:
            await lab.shutdown_kernels()
        except (OSError, httpclient.HTTPError, ValueError):
            pass  # the server's exit shuts them down too
        lab.stop()
        shutil.rmtree(settings, ignore_errors=True)
    return Figure(
        "execute round trip of `pass`, JupyterLab's kernel connection in chromium",
        sandbox,
        plain,
        "<= 1.2x",
    )


async def _run(page: Any, name: str, count: int) -> list[float]:
    times = await page.evaluate(
        "([name, count]) => window.__benchRun(name, count, 'pass')", [name, count]
    )
    return [float(t) for t in times]
