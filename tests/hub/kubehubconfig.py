"""hubconfig.py with zero-to-jupyterhub's spawner (read by ``jupyterhub -f``):
KubeSpawner runs each user's server in a pod on the real test node, set up as
deploy/jupyterhub/values.yaml sets up z2jh's (its image, no service-account
token, the ``singleuser.extraFiles`` mounted from a Secret).

``JSBX_HUB_KUBE`` (JSON) says where: ``namespace``, ``image``, ``connect_ip``
(the hub's address as pods reach it), ``files_secret`` and ``files`` (Secret key
-> mount path, as z2jh mounts extraFiles).  The hub reads ``KUBECONFIG``.
"""

import json
import os

c = get_config()  # type: ignore[name-defined]  # noqa: F821
load_subconfig(os.path.join(os.path.dirname(__file__), "hubconfig.py"))  # type: ignore[name-defined]  # noqa: F821

kube = json.loads(os.environ["JSBX_HUB_KUBE"])

c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.JupyterHub.hub_connect_url = f"http://{kube['connect_ip']}:{os.environ['JSBX_HUB_API_PORT']}"
# The recipe is in the image and the mounted files, not on the command line.
c.Spawner.args = []
c.Spawner.environment = {}
c.Spawner.start_timeout = 300

c.KubeSpawner.namespace = kube["namespace"]
c.KubeSpawner.image = kube["image"]
c.KubeSpawner.image_pull_policy = "Never"  # built on the node, no registry
# z2jh's singleuser defaults
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.KubeSpawner.uid = 1000
c.KubeSpawner.fs_gid = 100
c.KubeSpawner.delete_grace_period = 1
# values.yaml: hub.config.KubeSpawner and singleuser.serviceAccountName
c.KubeSpawner.automount_service_account_token = False
c.KubeSpawner.service_account = None
# values.yaml: singleuser.extraFiles, mounted as z2jh mounts them
c.KubeSpawner.volumes = [{"name": "files", "secret": {"secretName": kube["files_secret"]}}]
c.KubeSpawner.volume_mounts = [
    {"name": "files", "mountPath": path, "subPath": key} for key, path in kube["files"].items()
]
