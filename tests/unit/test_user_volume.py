"""Which user volume a claim gets, where it is mounted and which node it needs."""

from __future__ import annotations

import pytest

from jupyter_sandbox.operator.user_volume import (
    GUARD_HOME_ENV,
    HUB_SERVERNAME_ANNOTATION,
    HUB_USERNAME_ANNOTATION,
    KERNEL_CWD_ENV,
    PACKAGES_DIR_ENV,
    USER_VOLUME_PATH_ANNOTATION,
    USER_VOLUME_READ_ONLY_ANNOTATION,
    VOLUME_NAME,
    UserVolume,
    UserVolumeError,
    attach,
    choose_user_pvc,
    kernel_cwd,
    node_to_share,
    packages_dir,
    user_volume_of,
)


def pvc(name, user=None, server=None, modes=("ReadWriteOnce",), deleting=False):
    annotations = {}
    if user is not None:
        annotations[HUB_USERNAME_ANNOTATION] = user
    if server is not None:
        annotations[HUB_SERVERNAME_ANNOTATION] = server
    md = {"name": name, "annotations": annotations}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "spec": {"accessModes": list(modes)}}


def pod(name, claim, node="node-a", phase="Running", deleting=False):
    md = {"name": name}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": md,
        "spec": {
            "nodeName": node,
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": claim}}],
        },
        "status": {"phase": phase},
    }


def template(**annotations):
    return {"metadata": {"name": "t", "annotations": annotations}}


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, None),
        ({USER_VOLUME_PATH_ANNOTATION: "/home/jovyan"}, UserVolume("/home/jovyan", False)),
        ({USER_VOLUME_PATH_ANNOTATION: "/home/jovyan/"}, UserVolume("/home/jovyan", False)),
        (
            {USER_VOLUME_PATH_ANNOTATION: "/data", USER_VOLUME_READ_ONLY_ANNOTATION: "True"},
            UserVolume("/data", True),
        ),
        ({USER_VOLUME_PATH_ANNOTATION: "home/jovyan"}, "absolute"),
        ({USER_VOLUME_PATH_ANNOTATION: "/"}, "absolute"),
        ({USER_VOLUME_PATH_ANNOTATION: "/home/../etc"}, "normalized"),
        ({USER_VOLUME_PATH_ANNOTATION: "/data", USER_VOLUME_READ_ONLY_ANNOTATION: "yes"}, "true"),
    ],
)
def test_template_setting(annotations, expected):
    if isinstance(expected, str):
        with pytest.raises(UserVolumeError, match=expected):
            user_volume_of(template(**annotations))
    else:
        assert user_volume_of(template(**annotations)) == expected


@pytest.mark.parametrize(
    ("pvcs", "user", "server", "expected"),
    [
        ([pvc("claim-alice", "alice"), pvc("claim-bob", "bob")], "alice", None, "claim-alice"),
        # only the annotation counts, never the name
        ([pvc("claim-alice", "bob"), pvc("mine", "alice")], "alice", None, "mine"),
        ([pvc("claim-Alice", "Alice")], "alice", None, "no PersistentVolumeClaim"),
        ([pvc("claim-alice")], "alice", None, "no PersistentVolumeClaim"),
        ([pvc("claim-alice", "alice", deleting=True)], "alice", None, "no PersistentVolumeClaim"),
        ([pvc("claim-alice", "alice")], None, None, "names no user"),
        ([pvc("claim-alice", "alice")], "", None, "names no user"),
        # one volume per user serves all their servers
        ([pvc("claim-alice", "alice")], "alice", "gpu", "claim-alice"),
        (
            [pvc("claim-alice", "alice"), pvc("claim-alice-gpu", "alice", "gpu")],
            "alice",
            "gpu",
            "claim-alice-gpu",
        ),
        (
            [pvc("claim-alice", "alice"), pvc("claim-alice-gpu", "alice", "gpu")],
            "alice",
            None,
            "claim-alice",
        ),
        (
            [pvc("a1", "alice", "x"), pvc("a2", "alice", "y")],
            "alice",
            None,
            "several PersistentVolumeClaims",
        ),
    ],
)
def test_the_users_volume_is_chosen_by_annotation(pvcs, user, server, expected):
    if expected.startswith(("no ", "names", "several")):
        with pytest.raises(UserVolumeError, match=expected):
            choose_user_pvc(pvcs, user, server)
    else:
        assert choose_user_pvc(pvcs, user, server)["metadata"]["name"] == expected


@pytest.mark.parametrize(
    ("modes", "pods", "expected"),
    [
        (("ReadWriteMany",), [pod("p", "c")], None),
        (("ReadOnlyMany", "ReadWriteOnce"), [pod("p", "c")], None),
        (("ReadWriteOnce",), [], None),
        (("ReadWriteOnce",), [pod("p", "other")], None),
        (("ReadWriteOnce",), [pod("p", "c", node="n7")], "n7"),
        (("ReadWriteOnce",), [pod("p", "c", phase="Succeeded"), pod("q", "c", node="n2")], "n2"),
        (("ReadWriteOnce",), [pod("p", "c", deleting=True)], None),
        (("ReadWriteOnce",), [pod("p", "c", node="")], None),  # not scheduled yet
        (("ReadWriteOncePod",), [], None),
        (("ReadWriteOncePod",), [pod("p", "c")], "ReadWriteOncePod"),
        (("ReadWriteOnce",), [pod("p", "c", node="a"), pod("q", "c", node="b")], "several"),
    ],
)
def test_node_of_a_volume_in_use(modes, pods, expected):
    volume = pvc("c", "alice", modes=modes)
    if expected in ("ReadWriteOncePod", "several"):
        with pytest.raises(UserVolumeError, match=expected):
            node_to_share(volume, pods)
    else:
        assert node_to_share(volume, pods) == expected


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (None, "/home/jovyan"),
        ("/home/jovyan", "/home/jovyan"),
        ("/home/jovyan/project/data", "/home/jovyan/project/data"),
        ("/home/jovyan/a/../b", "/home/jovyan/b"),
        ("/home/jovyan/../root", "/home/jovyan"),
        ("/home/jovyanother", "/home/jovyan"),
        ("/etc", "/home/jovyan"),
        ("relative/dir", "/home/jovyan"),
    ],
)
def test_kernel_starts_in_the_notebooks_directory_only_on_the_volume(annotation, expected):
    annotations = {"jupyter-sandbox/kernel-cwd": annotation} if annotation else {}
    claim = {"metadata": {"annotations": annotations}}
    assert kernel_cwd(claim, UserVolume("/home/jovyan", False)) == expected


def test_attach_mounts_the_volume_in_the_first_container_and_pins_the_node():
    spec = {
        "containers": [
            {"name": "runtime", "env": [{"name": KERNEL_CWD_ENV, "value": "/x"}]},
            {"name": "sidecar"},
        ],
        "volumes": [{"name": "workspace", "emptyDir": {}}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                        {"matchExpressions": [{"key": "tpu", "operator": "Exists"}]},
                    ]
                }
            }
        },
    }
    attach(spec, "claim-alice", UserVolume("/home/jovyan", True), "/home/jovyan/p", "node-a")
    assert spec["volumes"][-1] == {
        "name": VOLUME_NAME,
        "persistentVolumeClaim": {"claimName": "claim-alice", "readOnly": True},
    }
    runtime, sidecar = spec["containers"]
    assert runtime["volumeMounts"] == [
        {"name": VOLUME_NAME, "mountPath": "/home/jovyan", "readOnly": True}
    ]
    assert runtime["env"] == [{"name": KERNEL_CWD_ENV, "value": "/home/jovyan/p"}]
    assert "volumeMounts" not in sidecar
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    pin = {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
    assert [t["matchFields"] for t in terms] == [[pin], [pin]]
    assert [t["matchExpressions"][0]["key"] for t in terms] == ["gpu", "tpu"]


def test_attach_without_a_node_adds_no_affinity_and_is_idempotent():
    spec = {"containers": [{"name": "runtime"}]}
    for _ in range(2):
        attach(spec, "c", UserVolume("/data", False), "/data", None)
    assert "affinity" not in spec
    assert len(spec["volumes"]) == 1
    assert len(spec["containers"][0]["volumeMounts"]) == 1
    names = [e["name"] for e in spec["containers"][0]["env"]]
    assert names == [KERNEL_CWD_ENV, PACKAGES_DIR_ENV, GUARD_HOME_ENV]


@pytest.mark.parametrize(
    ("cwd", "other"),
    [("/home/jovyan/analysis", "/home/jovyan/other"), ("/home/jovyan", "/home/jovyan/a")],
)
def test_a_projects_packages_are_kept_on_the_users_volume(cwd: str, other: str) -> None:
    """%pip of a kernel on the user's volume goes to the project's own directory
    there, so the project's next kernels (new pods) import it; another project's
    directory is another."""
    volume = UserVolume("/home/jovyan", False)
    spec = {"containers": [{"name": "runtime"}]}
    attach(spec, "claim-alice", volume, cwd, None)
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    kept = env[PACKAGES_DIR_ENV]
    assert kept == packages_dir(volume, cwd)
    assert kept.startswith("/home/jovyan/.local/share/jupyter-sandbox/packages/")
    assert kept != packages_dir(volume, other)


def test_a_read_only_volume_keeps_no_packages() -> None:
    spec = {"containers": [{"name": "runtime"}]}
    attach(spec, "claim-alice", UserVolume("/home/jovyan", True), "/home/jovyan/p", None)
    assert [e["name"] for e in spec["containers"][0]["env"]] == [KERNEL_CWD_ENV]


def test_attach_needs_a_container():
    with pytest.raises(UserVolumeError, match="no container"):
        attach({"containers": []}, "c", UserVolume("/data", False), "/data", None)
