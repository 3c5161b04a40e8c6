"""A Jupyter server's shared Kubernetes client lives on the provisioner's
background loop for the whole process: at exit its connection pool is closed,
not collected open (aiohttp's "Unclosed client session")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    from jupyter_sandbox.control_plane.base import BackendUnavailable
    from jupyter_sandbox.control_plane.factory import get_control_plane
    from jupyter_sandbox.utils.background import background

    async def use():
        plane = get_control_plane("kubernetes", kubeconfig=sys.argv[1], namespace="default")
        try:
            await plane.list_claims()
        except BackendUnavailable:
            pass  # nothing listens there: the client exists all the same
        return plane._kube is not None

    print("client made:", background().run_sync(use()))
    """
)

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_the_shared_client_is_closed_at_exit(tmp_path: Path) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(KUBECONFIG)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "client made: True" in proc.stdout
    assert "Unclosed" not in proc.stderr, proc.stderr
