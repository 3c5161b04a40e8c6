"""The claim service: claims for JupyterHub users' servers, which hold no Kubernetes credentials.

On a shared cluster a single-user server that could call the Kubernetes API
could also list, suspend or delete every other user's claims (RBAC cannot tell
one user's claims from another's). Instead, servers ask this service, showing
their own JupyterHub API token, as Enterprise Gateway holds the credentials for
its clients; the service creates, lists, suspends, resumes and deletes claims
only for the hub user the token belongs to, within per-user limits.

``app.py`` is the HTTP API (the same paths and bodies as the local daemon's,
``docs/rest-api.md``), ``limits.py`` the per-user limits, ``__main__.py`` the
``jupyter-sandbox claim-service`` program. The client is the Kubernetes
backend's ``claim_service_url`` option (``control_plane/service_client.py``).
"""
