"""A pool's declared requirements, and the host's pip index, as notebook users see them.

Offline on purpose: the requirements install a hand-built wheel with --no-index
--find-links, and the forwarded index is one that does not exist.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.base import ClaimError, InvalidRequest
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.local.isolation import POOL_PACKAGES, probe
from jupyter_sandbox.kernelspec import install_kernelspec

from .conftest import HOME, ROOT
from .helpers import KernelSocket, apply_pool, claims_for, jupyter_server, wait_for
from .security.attacker import run_attacker
from .test_cli import cli
from .test_packages import PACKAGE, build_wheel

pytestmark = [
    pytest.mark.usefixtures("warm_daemon"),
    pytest.mark.skipif(not probe().isolated, reason=f"no isolation here: {probe().detail}"),
]

REPO = Path(__file__).resolve().parents[1]


async def pool_status(name: str) -> object:
    plane = LocalControlPlane()
    try:
        return next((p for p in await plane.list_pools() if p.name == name), None)
    finally:
        await plane.close()


async def test_a_pools_requirements_are_there_at_once_read_only_and_pip_wins(
    tmp_path: Path,
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "1.0", "from the pool")
    newer = base64.b64encode(build_wheel(tmp_path, "2.0", "from the notebook").read_bytes())
    requirements = ["--no-index", f"--find-links {wheels}", PACKAGE]
    await apply_pool("withpkgs", {"replicas": 1, "files": "none", "requirements": requirements})
    install_kernelspec("withpkgs", prefix=str(ROOT))
    try:

        async def warm() -> bool:
            status = await pool_status("withpkgs")
            return bool(status and status.ready >= 1)  # type: ignore[attr-defined]

        await wait_for(warm, 180)
        installed = list((HOME / "pools" / "withpkgs").iterdir())
        assert len(installed) == 1 and not installed[0].name.startswith("."), installed
        with jupyter_server(tmp_path) as server:
            model = await server.request(
                "POST", "/api/kernels", {"name": "sandbox-withpkgs"}, expect=201
            )
            kernel_id = model["id"]
            claim = (await claims_for(kernel_id))[0]
            assert claim.warm is True, claim
            ws = await KernelSocket(server, kernel_id).connect()
            try:
                used = await ws.execute(f"import {PACKAGE} as m; print(m.VALUE, m.__file__)")
                value, where = used.stdout.strip().rsplit(" ", 1)
                assert value == "from the pool", used.outputs
                assert where.startswith(POOL_PACKAGES + "/"), where
                # Attacked from inside: the pool's directory is shared by every sandbox.
                attack = await ws.execute(
                    "import errno, os\n"
                    "def attempt(action):\n"
                    "    try:\n"
                    "        action()\n"
                    "        return 'WRITTEN'\n"
                    "    except OSError as exc:\n"
                    "        return errno.errorcode[exc.errno]\n"
                    f"root = {POOL_PACKAGES!r}\n"
                    "print(attempt(lambda: open(os.path.join(root, 'planted.py'), 'w')),\n"
                    f"      attempt(lambda: open(m.__file__, 'a').write('x = 1')),\n"
                    "      attempt(lambda: os.rename(os.path.dirname(m.__file__), '/tmp/x')),\n"
                    "      attempt(lambda: os.chmod(m.__file__, 0o777)))"
                )
                results = attack.stdout.split()
                assert len(results) == 4 and "WRITTEN" not in results, attack.outputs
                assert set(results) <= {"EROFS", "EACCES", "EPERM", "EXDEV"}, results
                # A notebook's own %pip install of another version wins.
                wheel = f"/tmp/{PACKAGE}-2.0-py3-none-any.whl"
                wrote = await ws.execute(
                    "import base64\n"
                    f"open({wheel!r}, 'wb').write(base64.b64decode({newer.decode()!r}))"
                )
                assert wrote.status == "ok", wrote.reply
                pip = await ws.execute(f"%pip install --no-index {wheel}", timeout=180)
                assert "Successfully installed" in pip.stdout, pip.outputs
                fresh = await ws.execute(
                    "import subprocess, sys\n"
                    "print(subprocess.run([sys.executable, '-c', "
                    f"'import {PACKAGE} as m; print(m.VALUE)'], capture_output=True, "
                    "text=True).stdout.strip())"
                )
                assert fresh.stdout.strip() == "from the notebook", fresh.outputs
            finally:
                ws.close()
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    finally:
        await apply_pool("withpkgs", None)

    async def removed() -> bool:
        return not (HOME / "pools" / "withpkgs").exists()

    await wait_for(removed, 30)


async def test_a_requirement_that_does_not_install_fails_the_pool_and_says_why(
    tmp_path: Path,
) -> None:
    requirements = ["--no-index", "jsbx-no-such-package-anywhere==9.9"]
    await apply_pool("badpkgs", {"replicas": 1, "requirements": requirements})
    install_kernelspec("badpkgs", prefix=str(ROOT))
    try:

        async def failed() -> str:
            status = await pool_status("badpkgs")
            message = str(getattr(status, "message", ""))
            return message if "did not install" in message else ""

        message = await wait_for(failed, 120)
        assert "jsbx-no-such-package-anywhere" in message, message
        listed = cli("pool", "list")
        assert "badpkgs: the pool's packages did not install" in listed.stdout, listed.stdout
        with jupyter_server(tmp_path) as server:
            answer = await server.request("POST", "/api/kernels", {"name": "sandbox-badpkgs"})
            text = json.dumps(answer)
            assert "did not install" in text and "jsbx-no-such-package-anywhere" in text, text
        plane = LocalControlPlane()
        try:
            from jupyter_sandbox.control_plane.base import ClaimRequest

            claim = await plane.claim(ClaimRequest(pool="badpkgs"))
            with pytest.raises(ClaimError, match="did not install"):
                await plane.wait_ready(claim.name, 30)
            await plane.release(claim.name)
        finally:
            await plane.close()
        assert not any(p.name.startswith("badpkgs-") for p in (HOME / "workspaces").iterdir())
        left = list((HOME / "pools").glob("badpkgs/*"))
        assert left == [], "no half-installed directory is left"
        # Other pools are not held up by it.
        assert (await pool_status("default")).ready >= 1  # type: ignore[union-attr]
    finally:
        await apply_pool("badpkgs", None)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("-e .", "an editable install links to a directory of the host"),
        ("--target /x", "the daemon chooses where the pool's packages go"),
    ],
)
async def test_lines_that_could_escape_are_refused_by_the_api_and_the_cli(
    tmp_path: Path, line: str, said: str
) -> None:
    with pytest.raises(InvalidRequest, match=said) as info:
        await apply_pool("escapes", {"requirements": ["numpy", line]})
    assert info.value.status == 400
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"numpy\n{line}\n")
    result = cli("pool", "create", "escapes", "--requirements", str(requirements))
    assert result.returncode == 2, result.stdout
    assert f"error: requirement line {line!r} is not allowed: {said}" in result.stderr
    assert "Traceback" not in result.stderr
    assert await pool_status("escapes") is None


@pytest.mark.parametrize("forward", [True, False], ids=["forwarded", "pool-turns-it-off"])
def test_the_hosts_pip_index_reaches_the_sandbox_but_no_credentials(
    tmp_path: Path, forward: bool
) -> None:
    """A daemon of its own, started with pip settings in its environment and config file."""
    home = tmp_path / "h"
    config = tmp_path / "pip.conf"
    config.write_text("[global]\ntrusted-host = example.invalid\n")
    ca = tmp_path / "corporate-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "JUPYTER_SANDBOX_"))}
    env.update(
        PYTHONPATH=str(REPO),
        JUPYTER_SANDBOX_HOME=str(home),
        JUPYTER_SANDBOX_DEFAULT_REPLICAS="1",
        JUPYTER_SANDBOX_IDLE_TIMEOUT="0",
        PIP_CONFIG_FILE=str(config),
        PIP_INDEX_URL="http://example.invalid/simple",
        PIP_EXTRA_INDEX_URL="http://alice:hunter2@example.invalid/private "
        "http://example.invalid/public",
        PIP_CERT=str(ca),
    )
    if not forward:
        env["ATTACK_POOL_SPEC"] = json.dumps({"replicas": 0, "pip_config": False})
    code = (
        "import json, os\n"
        "print(json.dumps({'pip': {k: v for k, v in os.environ.items() if k.startswith('PIP_')},"
        " 'leaked': any('hunter2' in v for v in os.environ.values()),"
        f" 'ca': os.path.exists({str(ca)!r}) and open({str(ca)!r}).read()}}))"
    )
    result = run_attacker(code, env, REPO)
    inside = json.loads(str(result["stdout"]).strip().splitlines()[-1])
    pip = inside["pip"]
    assert inside["leaked"] is False
    if not forward:
        assert not [k for k in pip if k not in ("PIP_TARGET", "PIP_DISABLE_PIP_VERSION_CHECK")], pip
        assert inside["ca"] is False, "the CA bundle is not bound either"
        return
    assert pip["PIP_INDEX_URL"] == "http://example.invalid/simple", pip
    assert pip["PIP_EXTRA_INDEX_URL"] == "http://example.invalid/public", pip
    assert pip["PIP_TRUSTED_HOST"] == "example.invalid", pip
    assert pip["PIP_CERT"] == str(ca) and "not really" in inside["ca"], inside
    assert inside["leaked"] is False
    log = (home / "daemon.log").read_text()
    assert "hunter2" not in log
    assert "carries credentials (or a path that may be a token), and a secret must never" in log, (
        log[-2000:]
    )
