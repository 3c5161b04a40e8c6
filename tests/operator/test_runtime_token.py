"""Each sandbox's runtime token (protocol/runtime_auth.py), made by the operator
against the real API server: a Secret of the sandbox's own, referred to by the
runtime's environment, its value nowhere in the pod; a Secret of that name that
somebody else made is a conflict, never used."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from jupyter_sandbox.protocol import runtime_auth

from .conftest import SB, is_ready, sandbox_body, wait_for

pytestmark = pytest.mark.cluster

KEY = b"a-runtime-key-for-these-tests-0123456789abcdef"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "runtime-key"
    path.write_bytes(KEY + b"\n")  # as a mounted Secret may end
    return path


def test_each_sandbox_gets_its_own_token_by_reference(kube, operator_factory, key_file):
    operator_factory(f"--runtime-key-file={key_file}")
    made = [kube.create(SB, sandbox_body(name)) for name in ("tok-a", "tok-b")]
    tokens = []
    for sb in made:
        name, uid = sb["metadata"]["name"], sb["metadata"]["uid"]
        wait_for(lambda n=name: (x := kube.get(SB, n)) and is_ready(x), 60, what=f"{name} Ready")
        secret = kube.core.read_namespaced_secret(runtime_auth.secret_name(name), kube.ns)
        token = base64.b64decode(secret.data[runtime_auth.SECRET_KEY]).decode()
        assert token == runtime_auth.token_for(KEY, kube.ns, name, uid)
        (ref,) = secret.metadata.owner_references
        assert (ref.kind, ref.uid, ref.controller) == ("Sandbox", uid, True)
        pod = kube.pod(name)
        (env,) = [e for e in pod.spec.containers[0].env if e.name == runtime_auth.ENV]
        assert env.value is None, "the token's value is in the pod spec"
        assert env.value_from.secret_key_ref.name == runtime_auth.secret_name(name)
        assert token not in str(pod.to_dict())
        tokens.append(token)
    assert tokens[0] != tokens[1]


def test_a_planted_secret_of_the_tokens_name_is_a_conflict(kube, operator_factory, key_file):
    """Whoever made the Secret would know the token: no pod starts with it."""
    kube.core.create_namespaced_secret(
        kube.ns,
        {
            "metadata": {"name": runtime_auth.secret_name("planted")},
            "stringData": {runtime_auth.SECRET_KEY: "known-to-the-attacker"},
        },
    )
    operator_factory(f"--runtime-key-file={key_file}")
    kube.create(SB, sandbox_body("planted"))
    wait_for(
        lambda: any("runtime-token" in (e.message or "") for e in kube.events("planted")),
        60,
        what="a ChildConflict event naming the Secret",
    )
    assert kube.pod("planted") is None


def test_an_unusable_key_stops_the_operator_with_the_reason(operator_factory, tmp_path):
    short = tmp_path / "short-key"
    short.write_text("too-short")
    op = operator_factory(f"--runtime-key-file={short}")
    assert op.proc is not None
    assert op.proc.wait(timeout=60) == 2
    assert "at least 32" in op.logs()
