"""Names a sandbox may neither create nor change in a directory bound from the host.

A bound notebook directory is shared with the user's own tools, and some of them
run what they find there without being asked: ``git status`` runs
``core.fsmonitor`` from a ``.git/config`` planted at any depth, a directory with a
``HEAD``, ``objects/`` and ``refs/`` is a (bare) repository to git, pytest imports
``conftest.py``, Python runs cached bytecode in place of the source it names.
Anything here could be code the host runs; ordinary files (a ``.py`` the user
later runs on purpose) are not guarded and the README says so.

Names are compared case-insensitively: on a case-insensitive filesystem ``.GIT``
is ``.git``.
"""

from __future__ import annotations

import os

from .paths import within

# name (casefolded) -> what on the host acts on it
GUARDED_NAMES: dict[str, str] = {
    ".git": "git runs commands from a repository's config and hooks",
    "head": "with objects/ and refs/ beside it a directory is a repository to git",
    ".hg": "Mercurial runs hooks from .hg/hgrc",
    ".envrc": "direnv runs it on entering the directory",
    ".vscode": "VS Code runs tasks and the interpreter named in its settings",
    ".idea": "JetBrains IDEs run its run configurations",
    ".devcontainer": "dev containers run its initializeCommand on the host",
    ".npmrc": "npm runs the shell and binaries it names",
    ".yarnrc": "yarn runs the yarnPath it names",
    ".yarnrc.yml": "yarn runs the yarnPath it names",
    ".pnpmfile.cjs": "pnpm runs it at install",
    "conftest.py": "pytest imports it",
    "sitecustomize.py": "Python imports it at startup from its path",
    "usercustomize.py": "Python imports it at startup from its path",
    "__pycache__": "Python runs the bytecode kept there in place of the source",
}
# suffix (casefolded) -> what on the host acts on it
GUARDED_SUFFIXES: dict[str, str] = {
    ".pyc": "Python runs bytecode files without their source",
    ".pth": "Python runs the import lines of .pth files in a site directory at startup",
}


HOME_DOTFILES = (
    "a hidden entry at the top of the user's home: their own server and shells run what is "
    "there (.bashrc, .profile, .jupyter/, .ipython/profile_default/startup/, "
    ".local/share/jupyter/kernels/, .config/)"
)


def home_refusal(relative: str, kept: str | None = None, making_dir: bool = False) -> str | None:
    """Why a path in a user's home volume (Kubernetes) may not be created or changed:
    a guarded name anywhere, or any hidden entry at its top, unless it lies in
    ``kept`` (the project's %pip packages, the sandbox's own; relative too) or is a
    directory on the way down to it."""
    if kept and (within(relative, kept) or (making_dir and within(kept, relative))):
        return None
    if relative.split(os.sep)[0].startswith(".") and relative != ".":
        return f"{relative.split(os.sep)[0]!r} is {HOME_DOTFILES}"
    return refusal(relative)


def refusal(relative: str) -> str | None:
    """Why a path (relative to the bound directory) may not be created or
    changed, or None when it may. Every component counts: ``sub/.git/config``
    is refused for its ``.git``."""
    for part in relative.split(os.sep):
        folded = part.casefold()
        why = GUARDED_NAMES.get(folded)
        if why is None:
            why = next((w for s, w in GUARDED_SUFFIXES.items() if folded.endswith(s)), None)
        if why is not None:
            return f"{part!r} is guarded in a directory bound from the host: {why}"
    return None
