"""The one Kubernetes access layer of the operator, the router and the backend.

- ``client``: an asyncio REST client on plain JSON dicts, one error type
  (``ApiError``) and ``Unreachable`` for a server that cannot be reached;
  credentials come from ``jupyter_sandbox.kubernetes_credentials``.
- ``informer``: list+watch caches of one resource type (pagination, bookmarks,
  relist on 410, backoff, tombstones), which the operator's reconcilers, the
  router's sandbox resolver and the backend's claim waits all use.
- ``times``: the API's timestamps.

``times`` imports nothing outside the standard library; the other modules need
the ``kubernetes`` extra.
"""
