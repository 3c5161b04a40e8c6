"""A notebook kernel in a real sandbox pod: the provisioner with the Kubernetes
backend claims from a warm pool of real runtime pods (our operator), kernel
traffic goes through the real router (resolving pod IPs from the API) to the
runtime in the pod; suspend saves the kernel's variables to the PVC, deletes the
pod and keeps the PVC, resume brings a new pod on the same PVC (a file the kernel
wrote and the variables are back), shutdown
deletes claim, sandbox, pod and service.  Then nbclient runs a notebook the same
way."""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.operator.conftest import CLAIM, SB, wait_for

from .conftest import pod_ready, sandbox_pod

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

SECRET = "real-node-router-secret-0123456789abcdef0123456789"


@pytest.fixture
def router(router_factory):
    return router_factory(SECRET)


def node_kernelspecs(kube_node_cluster, kube, router, tmp_path, pool: str, name: str):
    """A kernelspec ``name`` for ``pool`` on the node's cluster, through the router."""
    from jupyter_client.kernelspec import KernelSpecManager

    from jupyter_sandbox.kernelspec import make_kernelspec

    url, secret = router
    options = {
        "namespace": kube.ns,
        "kubeconfig": str(kube_node_cluster.kubeconfig),
        "router_url": url,
        "token_secret_file": str(secret),
    }
    kdir = tmp_path / "kernels" / name
    kdir.mkdir(parents=True)
    spec = make_kernelspec(pool, backend="kubernetes", backend_options=options)
    (kdir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])


@pytest.fixture
def kernelspecs(kube_node_cluster, kube, router, tmp_path):
    return node_kernelspecs(kube_node_cluster, kube, router, tmp_path, "python", "sbnode")


async def _execute(kc, code: str) -> dict:
    msg_id = kc.execute(code)
    reply = await kc.get_shell_msg(timeout=120)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok", reply["content"]
    while True:
        msg = await kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
            return msg["content"]["data"]


@asynccontextmanager
async def _kernel_in(specs, name: str, cwd: str) -> AsyncIterator[tuple]:
    """A kernel of kernelspec ``name`` started in ``cwd``, ready; shut down after."""
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name=name, kernel_spec_manager=specs)
    await km.start_kernel(cwd=cwd)
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=180)
        yield km, kc
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def test_kernel_in_real_pod_through_router(kube, warm_pool, kernelspecs):
    from jupyter_client.manager import AsyncKernelManager

    km = AsyncKernelManager(kernel_name="sbnode", kernel_spec_manager=kernelspecs)
    t0 = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    start_s = time.perf_counter() - t0
    prov = km.provisioner
    try:
        (claim,) = kube.list(CLAIM)
        sandbox = claim["status"]["sandbox"]["name"]
        assert sandbox in warm_pool, "not adopted from the warm pool"
        pod = sandbox_pod(kube, sandbox)
        assert pod_ready(pod)

        # the kernel really runs in the pod: its hostname is the pod's name,
        # its uid the image's user, and it writes to the PVC-backed workspace
        data = await _execute(
            kc,
            "import os, socket; open('/workspace/nb.txt', 'w').write('from the notebook'); "
            "(socket.gethostname(), os.getuid(), os.getcwd())",
        )
        assert data["text/plain"] == repr((sandbox, 1000, "/workspace"))
        # variables too: saved to the PVC before the pod goes, loaded by the next one
        await _execute(kc, "y = 41; squares = {i: i * i for i in range(5)}; 'defined'")

        # suspend (what the culler does): pod deleted, PVC kept
        t1 = time.perf_counter()
        await prov.suspend()
        wait_for(lambda: sandbox_pod(kube, sandbox) is None, 120, what="pod deleted on suspend")
        suspend_s = time.perf_counter() - t1
        pvc = kube.core.read_namespaced_persistent_volume_claim(f"workspace-{sandbox}", kube.ns)
        assert pvc.status.phase == "Bound"
        assert await km.is_alive()

        # resume: a new pod on the same PVC; the kernel is new, the file is not
        t2 = time.perf_counter()
        await prov.resume()
        data = await _execute(kc, "open('/workspace/nb.txt').read()")
        resume_s = time.perf_counter() - t2
        assert data["text/plain"] == repr("from the notebook")
        data = await _execute(kc, "(y + 1, squares[4])")
        assert data["text/plain"] == repr((42, 16)), "the variables came back in the new pod"
        new = sandbox_pod(kube, sandbox)
        assert new is not None and new.metadata.uid != pod.metadata.uid
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)

    name = claim["metadata"]["name"]
    wait_for(lambda: kube.get(CLAIM, name) is None, 60, what="claim deleted")
    wait_for(lambda: kube.get(SB, sandbox) is None, 60, what="sandbox deleted")
    wait_for(lambda: sandbox_pod(kube, sandbox) is None, 120, what="pod deleted")
    from kubernetes import client

    with pytest.raises(client.ApiException) as e:
        kube.core.read_namespaced_service(sandbox, kube.ns)
    assert e.value.status == 404
    print(
        f"\n[node] kernel start (warm claim + router + real pod) {start_s:.2f}s;"
        f" suspend {suspend_s:.1f}s; resume to first reply {resume_s:.1f}s"
    )


async def test_nbclient_runs_a_notebook_in_a_real_pod(kube, warm_pool, kernelspecs, tmp_path):
    import nbformat
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import socket, sys\nhost = socket.gethostname()"),
        nbformat.v4.new_code_cell("print(host.startswith('python-'), sys.version_info[:2])"),
        nbformat.v4.new_code_cell("sum(range(10))"),
        # Copy mode (a Kubernetes kernelspec's default): the notebook's directory is
        # copied into the pod, and what the notebook writes comes back at shutdown.
        nbformat.v4.new_code_cell(
            "import os\nprint(os.getcwd(), open('data.csv').read().split()[1])\n"
            "open('result.txt', 'w').write(host)"
        ),
    ]
    (tmp_path / "data.csv").write_text("a\n7\n")

    class KM(AsyncKernelManager):  # nbclient makes (and owns, so shuts down) the manager
        def __init__(self, **kw):
            kw.setdefault("kernel_spec_manager", kernelspecs)
            super().__init__(**kw)

    client = NotebookClient(
        nb,
        kernel_name="sbnode",
        kernel_manager_class=KM,
        timeout=120,
        iopub_timeout=30,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    await client.async_execute()
    assert nb.cells[1].outputs[0]["text"] == "True (3, 11)\n"
    assert nb.cells[2].outputs[0]["data"]["text/plain"] == "45"
    assert nb.cells[3].outputs[0]["text"] == "/workspace 7\n"
    assert (tmp_path / "result.txt").read_text().startswith("python-"), "copied back from the pod"
    # nbclient shut the kernel down: its claim is gone
    wait_for(lambda: not kube.list(CLAIM), 60, what="claim deleted after nbclient")


PLANT_IN_HOME = """
import json, os
out = {{}}
for name in (".jupyter/jupyter_server_config.py", ".bashrc",
             ".local/share/jupyter/kernels/x/kernel.json", "project/.git/config",
             "project/notes.txt"):
    path = os.path.join({home!r}, name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").write("print('planted')\\n")
        out[name] = "made"
    except OSError as exc:
        out[name] = type(exc).__name__
json.dumps(out)
"""


async def test_a_pool_with_the_users_volume_shows_the_notebooks_directory(
    kube_node_cluster, kube, host_pvs, operator, router, tmp_path
):
    """A template annotated ``jupyter-sandbox/user-volume-path`` mounts the user's PVC
    (KubeSpawner's ``claim-<user>``, found by its ``hub.jupyter.org/username``
    annotation) at the path the Jupyter server has it: the kernel starts in the
    notebook's directory, reads what is there and writes straight to it, with no
    copy, and is there again after a suspend and resume in a new pod. What it
    installs with %pip is kept on the volume for the project's next kernel."""
    import getpass

    from tests.operator.conftest import POOL, TPL
    from tests.test_packages import PACKAGE, build_wheel

    from .conftest import example_objects

    home = tmp_path / "home"
    project = home / "project"
    project.mkdir(parents=True)
    (project / "data.csv").write_text("a\n7\n")
    wheel = build_wheel(project)
    for path in (home, project, project / "data.csv", wheel):
        os.chown(path, 1000, 1000)
    pv = f"pv-{kube.ns}-home"
    user = getpass.getuser()
    kube.core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(home), "type": "Directory"},
                # reserved for the user's claim, so no sandbox workspace takes it
                "claimRef": {"namespace": kube.ns, "name": f"claim-{user}"},
            },
        }
    )
    try:
        kube.core.create_namespaced_persistent_volume_claim(
            kube.ns,
            {
                "metadata": {
                    "name": f"claim-{user}",
                    "annotations": {"hub.jupyter.org/username": user},
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                    "volumeName": pv,
                },
            },
        )
        tpl, pool = example_objects(kube_node_cluster.runtime_image)
        tpl["metadata"]["name"] = pool["metadata"]["name"] = "home"
        tpl["metadata"]["annotations"] = {"jupyter-sandbox/user-volume-path": str(home)}
        # as in zero-to-jupyterhub, the volume is the pod's home
        (container,) = tpl["spec"]["podTemplate"]["spec"]["containers"]
        container.setdefault("env", []).append({"name": "HOME", "value": str(home)})
        pool["spec"]["sandboxTemplateRef"]["name"] = "home"
        pool["spec"]["replicas"] = 0
        kube.create(TPL, tpl)
        kube.create(POOL, pool)

        specs = node_kernelspecs(kube_node_cluster, kube, router, tmp_path, "home", "sbhome")

        async with _kernel_in(specs, "sbhome", str(project)) as (km, kc):
            data = await _execute(
                kc,
                "import os\nopen('result.txt', 'w').write('from the pod')\n"
                "'|'.join([os.getcwd(), open('data.csv').read().split()[1], "
                "str(os.path.exists('/workspace/data.csv'))])",
            )
            expected = "|".join([str(project), "7", "False"])
            assert data["text/plain"] == repr(expected), "mounted, not copied"
            # written straight to the user's volume, by the sandbox's user, while it runs
            assert (project / "result.txt").read_text() == "from the pod"
            assert (project / "result.txt").stat().st_uid == 1000

            # The volume is the user's home: their own server and shells read its
            # dotfiles, and git runs what a .git holds. None can be written from here.
            data = await _execute(kc, PLANT_IN_HOME.format(home=str(home)))
            planted = json.loads(data["text/plain"].strip("'"))
            # the kernel's own dotfiles (IPython's profile, caches) go to its workspace
            data = await _execute(kc, "os.environ['HOME']")
            assert data["text/plain"] == repr("/workspace")
            assert planted == {
                ".jupyter/jupyter_server_config.py": "PermissionError",
                ".bashrc": "PermissionError",
                ".local/share/jupyter/kernels/x/kernel.json": "PermissionError",
                "project/.git/config": "PermissionError",
                "project/notes.txt": "made",
            }, planted
            assert not (home / ".jupyter").exists() and not (home / ".bashrc").exists()
            assert not (project / ".git").exists()

            await km.provisioner.suspend()
            (project / "later.txt").write_text("written while suspended")
            await km.provisioner.resume()
            data = await _execute(kc, "os.getcwd() + '|' + open('later.txt').read()")
            assert data["text/plain"] == repr(f"{project}|written while suspended")
            # %pip (pip with the kernel's environment) of a wheel next to the notebook
            data = await _execute(
                kc,
                "import subprocess, sys\n"
                f"subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-index', "
                f"{wheel.name!r}], capture_output=True).returncode",
            )
            assert data["text/plain"] == "0"
        wait_for(lambda: not kube.list(CLAIM), 60, what="claim deleted")
        # The project's next kernel, in a new pod, imports the package at once.
        async with _kernel_in(specs, "sbhome", str(project)) as (_, kc):
            code = f"import {PACKAGE}; {PACKAGE}.VALUE + '|' + {PACKAGE}.__file__"
            data = await _execute(kc, code)
            value, where = data["text/plain"].strip("'").split("|")
            assert value == "installed in the sandbox"
            assert where.startswith(str(home / ".local/share/jupyter-sandbox/packages") + "/")
        wait_for(lambda: not kube.list(CLAIM), 60, what="claim deleted")
        # the user's volume outlives the sandbox: it is not the sandbox's to delete
        assert kube.core.read_namespaced_persistent_volume_claim(f"claim-{user}", kube.ns)
        assert (project / "result.txt").exists()
    finally:
        kube.core.delete_persistent_volume(pv)
