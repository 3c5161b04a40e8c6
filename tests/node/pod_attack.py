"""Run inside a hub user's single-user pod (``python -c``, stdlib only): every
route by which that user's pod could reach another user's kernel, tried with
whatever the pod holds.  Prints one JSON object: route -> what came back.

argv[1] is JSON: ``claim_service`` and ``router`` (URLs as the pod reaches
them), the victim's ``claim``, ``sandbox``, ``sandbox_ip`` (the sandbox pod),
``server_ip`` and ``user`` (the victim's single-user pod), ``namespace``,
``runtime_header`` (the runtime's credential header).
"""

import json
import os
import ssl
import sys
import urllib.error
import urllib.request

target = json.loads(sys.argv[1])
token = os.environ["JUPYTERHUB_API_TOKEN"]  # this pod's own hub token
results: dict[str, object] = {}


def status(method: str, url: str, headers: dict[str, str] | None = None, **kw) -> object:
    """The HTTP status, or the error's name if nothing answered."""
    request = urllib.request.Request(
        url, method=method, headers=headers or {}, data=b"{}" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(request, timeout=15, **kw) as response:
            body = response.read()
            return {"status": response.status, "body": body[:2000].decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError) as exc:
        return type(exc).__name__


hub_auth = {"Authorization": f"token {token}"}
service = target["claim_service"]
victim = target["claim"]

# 1. the claim service, with this pod's token: list, read, suspend, resume, delete
results["service list"] = status("GET", f"{service}/api/claims", hub_auth)
results["service get"] = status("GET", f"{service}/api/claims/{victim}", hub_auth)
for verb in ("suspend", "resume"):
    results[f"service {verb}"] = status("POST", f"{service}/api/claims/{victim}/{verb}", hub_auth)
results["service delete"] = status("DELETE", f"{service}/api/claims/{victim}", hub_auth)

# 2. the router, with this pod's token, to the victim's sandbox
results["router"] = status(
    "GET",
    f"{target['router']}/api/kernel",
    {
        **hub_auth,
        "X-Sandbox-ID": target["sandbox"],
        "X-Sandbox-Namespace": target["namespace"],
        "X-Sandbox-Port": "8888",
    },
)

# 3. the victim's sandbox pod by its IP: no credential, this pod's token, a forged one
runtime = f"http://{target['sandbox_ip']}:8888"
results["pod ip kernel"] = status("GET", f"{runtime}/api/kernel")
results["pod ip channels"] = status("GET", f"{runtime}/api/kernel/channels")
results["pod ip variables"] = status("GET", f"{runtime}/api/kernel/state")
results["pod ip execute"] = status("POST", f"{runtime}/execute")
results["pod ip with hub token"] = status(
    "GET", f"{runtime}/api/kernel/state", {target["runtime_header"]: token, **hub_auth}
)

# 4. the victim's single-user server by its pod IP, with this pod's token
server = f"http://{target['server_ip']}:8888/user/{target['user']}"
results["server kernels"] = status("GET", f"{server}/api/kernels", hub_auth)
results["server sessions"] = status("GET", f"{server}/api/sessions", hub_auth)

# 5. the Kubernetes API with whatever sits in this pod
token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token"
results["service account token"] = os.path.exists(token_file)
api = f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
insecure = ssl.create_default_context()
insecure.check_hostname = False
insecure.verify_mode = ssl.CERT_NONE
claims_path = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{target['namespace']}"
for name, path in (
    ("kube claims", f"{claims_path}/sandboxclaims"),
    ("kube pods", f"/api/v1/namespaces/{target['namespace']}/pods"),
):
    results[name] = status("GET", f"{api}{path}", context=insecure)
    results[f"{name} with hub token"] = status(
        "GET", f"{api}{path}", {"Authorization": f"Bearer {token}"}, context=insecure
    )

# 6. the hub itself, with this pod's token
hub_api = os.environ["JUPYTERHUB_API_URL"]
results["hub user"] = status("GET", f"{hub_api}/users/{target['user']}", hub_auth)
results["hub token"] = status("POST", f"{hub_api}/users/{target['user']}/tokens", hub_auth)

print(json.dumps(results))
