"""Which names a bound directory's write guard refuses, part by part."""

from __future__ import annotations

import pytest

from jupyter_sandbox.runtime.guarded_names import refusal


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
