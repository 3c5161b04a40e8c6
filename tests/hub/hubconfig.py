"""JupyterHub configuration of the two-user isolation test (read by ``jupyterhub -f``).

Everything machine-specific comes from ``JSBX_HUB_*`` environment variables set
by the test. The sandbox-relevant part is the recipe of docs/jupyterhub.md.
"""

import os
import sys

c = get_config()  # type: ignore[name-defined]  # noqa: F821

root = os.environ["JSBX_HUB_ROOT"]

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ["JSBX_HUB_PORT"])
# the hub API on another address when pods must reach it (the real-node tests)
c.JupyterHub.hub_ip = os.environ.get("JSBX_HUB_API_IP", "127.0.0.1")
c.JupyterHub.hub_port = int(os.environ["JSBX_HUB_API_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['JSBX_HUB_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [os.environ["JSBX_HUB_CHP"]]
c.JupyterHub.db_url = f"sqlite:///{root}/hub.sqlite"
c.JupyterHub.cookie_secret_file = f"{root}/cookie_secret"
c.JupyterHub.pid_file = f"{root}/hub.pid"
c.JupyterHub.cleanup_servers = True

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.services = [{"name": "test-admin", "api_token": os.environ["JSBX_HUB_ADMIN_TOKEN"]}]
c.JupyterHub.load_roles = [
    {
        "name": "test-admin",
        "scopes": ["admin:users", "admin:servers", "tokens", "list:users", "read:users"],
        "services": ["test-admin"],
    }
]

# Single-user servers as local processes (one OS user: testing only, see the docs).
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = f"{root}/homes/{{username}}"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120

# --- the recipe -------------------------------------------------------------------
c.Spawner.args = [
    "--allow-root",
    # Kernels run in sandboxes, suspended when culled.
    "--ServerApp.kernel_manager_class="
    "jupyter_sandbox.kernel_provisioner.manager.SandboxKernelManager",
    # Only sandboxed kernels, and no host shell: nothing of the user's runs on the host.
    # allowed_kernelspecs only hides other kernelspecs; the default provisioner
    # is what puts a kernel started by any other name into a sandbox too.
    "--KernelProvisionerFactory.default_provisioner_name=sandbox-provisioner",
    "--KernelSpecManager.allowed_kernelspecs=sandbox-default",
    "--KernelSpecManager.ensure_native_kernel=False",
    "--ServerApp.terminals_enabled=False",
]
c.Spawner.environment = {
    # One local sandbox daemon per hub user: its own state dir, router, secret.
    "JUPYTER_SANDBOX_HOME": lambda spawner: f"{root}/sandbox/{spawner.user.name}",
    "JUPYTER_RUNTIME_DIR": lambda spawner: f"{root}/runtime/{spawner.user.name}",
    "JUPYTER_PATH": os.environ.get("JUPYTER_PATH", ""),
    "JUPYTER_SANDBOX_DEFAULT_REPLICAS": "1",
    "JUPYTER_SANDBOX_IDLE_TIMEOUT": "0",
    "JUPYTER_SANDBOX_ORPHAN_GRACE": "1",
}
