"""Which claims a Jupyter server calls its own (kernel_provisioner/manager.py
``server_id_for``), table-driven: under JupyterHub, one id per hub user and server."""

from __future__ import annotations

from jupyter_sandbox.kernel_provisioner.manager import server_id_for

Z2JH = ("jovyan", "/home/jovyan")  # every single-user pod of zero-to-jupyterhub


def test_two_hub_users_in_identical_pods_get_different_ids() -> None:
    alice = server_id_for(*Z2JH, {"JUPYTERHUB_USER": "alice"})
    bob = server_id_for(*Z2JH, {"JUPYTERHUB_USER": "bob"})
    assert alice != bob


def test_a_users_named_servers_are_told_apart_and_a_restart_keeps_its_id() -> None:
    default = server_id_for(*Z2JH, {"JUPYTERHUB_USER": "alice"})
    gpu = server_id_for(*Z2JH, {"JUPYTERHUB_USER": "alice", "JUPYTERHUB_SERVER_NAME": "gpu"})
    assert default != gpu
    assert gpu == server_id_for(
        *Z2JH, {"JUPYTERHUB_USER": "alice", "JUPYTERHUB_SERVER_NAME": "gpu"}
    )


def test_outside_jupyterhub_the_id_is_the_local_user_and_root_as_before() -> None:
    import hashlib

    # unchanged from earlier releases, so an upgraded server re-attaches its kernels
    assert server_id_for("alice", "/srv/a", {}) == hashlib.sha256(b"alice:/srv/a").hexdigest()[:16]
    assert server_id_for("alice", "/srv/a", {}) == server_id_for("alice", "/srv/a", {})
    assert server_id_for("alice", "/srv/a", {}) != server_id_for("alice", "/srv/b", {})
    assert server_id_for("alice", "/srv/a", {}) != server_id_for("bob", "/srv/a", {})
