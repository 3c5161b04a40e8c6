"""Which extra to install when a role's module is missing (jupyter_sandbox/utils/extras.py)."""

from __future__ import annotations

import pytest

from jupyter_sandbox.utils.extras import extras_providing, missing_extra_message


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("kubernetes", {"kubernetes"}),
        ("kubernetes.client", {"kubernetes"}),
        ("prometheus_client", {"kubernetes"}),
        ("jupyter_server", {"jupyter", "lab"}),
        ("jupyterlab", {"lab"}),
        ("jwt", {"jupyter", "kubernetes", "lab"}),
        ("numpy", set()),
        ("tornado", set()),  # a base requirement: never missing, no extra to name
    ],
)
def test_the_extras_that_provide_a_module(module, expected):
    assert set(extras_providing(module)) - {"all", "test"} == expected


@pytest.mark.parametrize(
    ("command", "module", "role", "expected"),
    [
        (
            "jupyter-sandbox operator",
            "kubernetes",
            "kubernetes",
            "pip install 'jupyter-sandbox[kubernetes]'",
        ),
        (
            "jupyter-sandbox router",
            "aiohttp",
            "kubernetes",
            "pip install 'jupyter-sandbox[kubernetes]'",
        ),
        ("jupyter-sandbox lab", "jupyter_server", "lab", "pip install 'jupyter-sandbox[lab]'"),
        ("jupyter-sandbox pool", "httpx", None, "pip install 'jupyter-sandbox[jupyter]'"),
        ("jupyter-sandbox pool", "numpy", None, "numpy is not installed"),
    ],
)
def test_the_message_names_the_commands_own_extra(command, module, role, expected):
    exc = ModuleNotFoundError(f"No module named {module!r}", name=module)
    message = missing_extra_message(command, exc, role)
    assert message.startswith(f"{command}: ")
    assert expected in message
