"""The operator's client logs in the ways real kubeconfigs do, against the real
API server: an exec credential plugin (what EKS, GKE and AKS kubeconfigs use), a
client certificate embedded as data, and a token that has rotated since it was
read.  Before the official loader was used, an exec kubeconfig sent no
credentials at all and an unknown context was a bare ``StopIteration``."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_sandbox.kube.client import POD, Client, load_config

from .conftest import REPO

pytestmark = pytest.mark.cluster


def _cluster(kubeconfig: Path) -> tuple[dict[str, Any], str]:
    """The test cluster's entry (CA embedded as data) and its admin token."""
    cfg = yaml.safe_load(kubeconfig.read_text())
    cluster = dict(cfg["clusters"][0]["cluster"])
    ca_path = cluster.pop("certificate-authority", None)
    if ca_path:
        cluster["certificate-authority-data"] = base64.b64encode(
            Path(ca_path).read_bytes()
        ).decode()
    return cluster, cfg["users"][0]["user"].get("token", "")


def _write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


def _exec_plugin(tmp_path: Path, tokens: list[str]) -> tuple[dict[str, Any], Path]:
    """An exec credential plugin that hands out ``tokens`` in turn (the last one
    from then on), each expiring within the loader's refresh margin, so every
    credential check runs it again.  Returns the user entry and its call log."""
    calls = tmp_path / "plugin-calls"
    script = tmp_path / "credential-plugin.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import datetime, json, pathlib
            calls = pathlib.Path({str(calls)!r})
            n = len(calls.read_text().splitlines()) if calls.exists() else 0
            with calls.open("a") as f:
                f.write("call\\n")
            tokens = {tokens!r}
            expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=1)
            print(json.dumps({{
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {{
                    "token": tokens[min(n, len(tokens) - 1)],
                    "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }},
            }}))
            """
        )
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(script)],
            "interactiveMode": "Never",
        }
    }
    return user, calls


def _list_pods(kubeconfig: Path, namespace: str) -> dict:
    async def go() -> dict:
        settings = await asyncio.to_thread(load_config, str(kubeconfig))
        client = Client(settings)
        try:
            return await client.list(POD, namespace)
        finally:
            await client.close()

    return asyncio.run(go())


def test_an_exec_credential_plugin_logs_the_operator_in(kube_cluster, kube, tmp_path):
    cluster, token = _cluster(kube_cluster.kubeconfig)
    if not token:
        pytest.skip("the cluster's kubeconfig has no token to hand out")
    user, calls = _exec_plugin(tmp_path, [token])
    kubeconfig = _write_kubeconfig(tmp_path / "kubeconfig", cluster, user)

    assert _list_pods(kubeconfig, kube.ns)["kind"] == "PodList"
    assert calls.exists(), "the exec plugin never ran"


def test_a_token_rotated_since_it_was_read_is_fetched_again_after_a_401(
    kube_cluster, kube, tmp_path
):
    cluster, token = _cluster(kube_cluster.kubeconfig)
    if not token:
        pytest.skip("the cluster's kubeconfig has no token to hand out")
    # The plugin runs once when the kubeconfig is loaded and once when the first
    # request asks for its token: both hand out a credential that is already
    # revoked.  Only asking again after the 401 gets a valid one.
    user, calls = _exec_plugin(tmp_path, ["revoked-token", "revoked-token", token])
    kubeconfig = _write_kubeconfig(tmp_path / "kubeconfig", cluster, user)

    assert _list_pods(kubeconfig, kube.ns)["kind"] == "PodList"
    assert len(calls.read_text().splitlines()) == 3


def test_a_client_certificate_given_as_data_logs_the_operator_in(kube_cluster, kube, tmp_path):
    cluster, _ = _cluster(kube_cluster.kubeconfig)
    ca_path = yaml.safe_load(kube_cluster.kubeconfig.read_text())["clusters"][0]["cluster"].get(
        "certificate-authority"
    )
    pki = Path(ca_path).parent if ca_path else None
    if pki is None or not (pki / "kubelet-client.crt").exists():
        pytest.skip("no client certificate of the test control plane at hand")
    user = {
        "client-certificate-data": base64.b64encode((pki / "kubelet-client.crt").read_bytes()),
        "client-key-data": base64.b64encode((pki / "kubelet-client.key").read_bytes()),
    }
    user = {k: v.decode() for k, v in user.items()}
    kubeconfig = _write_kubeconfig(tmp_path / "kubeconfig", cluster, user)

    assert _list_pods(kubeconfig, kube.ns)["kind"] == "PodList"


def test_a_wrong_token_is_refused_not_retried_forever(kube_cluster, kube, tmp_path):
    cluster, _ = _cluster(kube_cluster.kubeconfig)
    kubeconfig = _write_kubeconfig(tmp_path / "kubeconfig", cluster, {"token": "not-a-token"})
    from jupyter_sandbox.kube.client import ApiError

    with pytest.raises(ApiError) as err:
        _list_pods(kubeconfig, kube.ns)
    assert err.value.status == 401


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--context", "no-such-context"], "no-such-context"),
        (["--kubeconfig", "{tmp}/missing"], "does not exist"),
    ],
)
def test_the_operator_cli_names_what_is_wrong_with_its_credentials(
    kube_cluster, tmp_path, args, expected
):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--kubeconfig" not in argv:
        argv += ["--kubeconfig", str(kube_cluster.kubeconfig)]
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.operator", *argv, "--metrics-bind-address", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert "no usable Kubernetes configuration" in proc.stderr or "does not exist" in proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
