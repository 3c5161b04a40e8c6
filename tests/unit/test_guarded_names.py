"""Which names a bound directory's write guard refuses, part by part."""

from __future__ import annotations

import pytest

from jupyter_sandbox.runtime.guarded_names import home_refusal, refusal


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ("data.csv", False),
        ("results/2024/out.txt", False),
        ("analysis.ipynb", False),
        ("helper.py", False),
        ("git", False),
        (".gitignore", False),
        ("header.txt", False),
        ("my_conftest.py", False),
        (".", False),
        (".git", True),
        (".git/config", True),
        ("sub/deeper/.git/hooks/post-checkout", True),
        (".GIT", True),
        ("sub/HEAD", True),
        ("head", True),
        (".hg/hgrc", True),
        (".envrc", True),
        (".vscode/settings.json", True),
        (".idea/workspace.xml", True),
        (".devcontainer/devcontainer.json", True),
        (".npmrc", True),
        (".yarnrc.yml", True),
        ("conftest.py", True),
        ("tests/conftest.py", True),
        ("sitecustomize.py", True),
        ("__pycache__/helper.cpython-311.pyc", True),
        ("helper.pyc", True),
        ("helper.PYC", True),
        ("lib/site-packages/evil.pth", True),
    ],
)
def test_which_paths_are_refused(path: str, refused: bool) -> None:
    why = refusal(path)
    assert (why is not None) is refused, why
    if why is not None:
        assert "guarded in a directory bound from the host" in why


KEPT = ".local/share/jupyter-sandbox/packages/0123456789abcdef"


@pytest.mark.parametrize(
    ("path", "making_dir", "refused"),
    [
        ("project/data.csv", False, False),
        ("project/.env", False, False),
        ("project/.git/config", False, True),
        (".bashrc", False, True),
        (".profile", False, True),
        (".jupyter/jupyter_server_config.py", False, True),
        (".ipython/profile_default/startup/00-x.py", False, True),
        (".local/share/jupyter/kernels/evil/kernel.json", False, True),
        (".config", True, True),
        # the project's %pip packages, the sandbox's own, and the way down to them
        (f"{KEPT}/pkg/__init__.py", False, False),
        (f"{KEPT}/pkg/__pycache__/x.pyc", False, False),
        (f"{KEPT}/distutils-precedence.pth", False, False),
        (".local", True, False),
        (".local/share", True, False),
        (".local", False, True),  # a file there would not be on the way
        (".local/share/jupyter", True, True),
    ],
)
def test_which_paths_of_a_users_home_are_refused(
    path: str, making_dir: bool, refused: bool
) -> None:
    why = home_refusal(path, KEPT, making_dir)
    assert (why is not None) is refused, why
