"""A real Kubernetes control plane on loopback, for tests.

Starts etcd, kube-apiserver, kube-controller-manager and (optionally)
kube-scheduler plus kwok (a fake kubelet that makes bound pods Running/Ready
with pod IPs) from the binaries that ``tests/cluster/build.sh`` produces, much
like controller-runtime's envtest.  Everything runs as child processes in their
own process group, with data and certificates in one temporary directory;
:meth:`ControlPlane.stop` kills the lot and removes the directory.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

K8S_VERSION = os.environ.get("K8S_VERSION", "1.36.3")
REQUIRED = ("etcd", "kube-apiserver", "kube-controller-manager")
SERVICE_CIDR = "10.0.0.0/24"
# the ClusterIP of the default `kubernetes` Service: the first address of the range
KUBERNETES_SERVICE_IP = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
OPTIONAL = ("kube-scheduler", "kwok")


def cache_root() -> Path:
    env = os.environ.get("JUPYTER_SANDBOX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "jupyter-sandbox"


def bin_dir() -> Path:
    return cache_root() / f"k8s-v{K8S_VERSION}" / "bin"


def find_binary(name: str) -> Path | None:
    """KUBEBUILDER_ASSETS first (setup-envtest layout), then our build cache."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    for d in ([Path(assets)] if assets else []) + [bin_dir()]:
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def missing_binaries(with_kwok: bool = True) -> list[str]:
    names = list(REQUIRED) + (list(OPTIONAL) if with_kwok else [])
    return [n for n in names if find_binary(n) is None]


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all held open while they are chosen (two
    free_port() calls in a row can answer the same port, as a hub test found)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


# --------------------------------------------------------------------------- certs


def _write_pki(d: Path, extra_ips: tuple[str, ...] = ()) -> None:
    """Self-signed CA, an apiserver serving cert for 127.0.0.1 (and ``extra_ips``),
    and an SA key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    now = _dt.datetime.now(_dt.UTC) - _dt.timedelta(minutes=5)
    later = now + _dt.timedelta(days=7)

    def pem_key(k) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jupyter-sandbox-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(subject: list, *extensions) -> tuple:
        """A key and a certificate for it signed by the CA (a week, like the CA)."""
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
        )
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    srv_key, srv = leaf(
        [x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")],
        x509.SubjectAlternativeName(
            [
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
                x509.DNSName("localhost"),
                x509.DNSName("kubernetes"),
                x509.DNSName("kubernetes.default"),
                x509.DNSName("kubernetes.default.svc"),
                x509.DNSName("kubernetes.default.svc.cluster.local"),
            ]
        ),
        x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
    )
    # the API server's client certificate towards kubelets (logs, exec, port-forward)
    kc_key, kc = leaf(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client"),
        ],
        x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
    )
    (d / "kubelet-client.crt").write_bytes(kc.public_bytes(serialization.Encoding.PEM))
    (d / "kubelet-client.key").write_bytes(pem_key(kc_key))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "ca.key").write_bytes(pem_key(ca_key))
    (d / "apiserver.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    (d / "apiserver.key").write_bytes(pem_key(srv_key))
    (d / "sa.key").write_bytes(pem_key(sa_key))
    (d / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


# --------------------------------------------------------------------------- control plane


@dataclass
class ControlPlane:
    """Start with :meth:`start`, stop with :meth:`stop` (or use as a context manager)."""

    with_scheduler: bool = True
    with_kwok: bool = True
    nodes: int = 1
    workdir: Path | None = None
    log_to_files: bool = True
    # for a real node whose pods use the API (in-cluster clients): a host address
    # the pods reach (the node's bridge address).  The API server then listens on
    # all addresses (the bridge may not exist yet), advertises this one (the lease
    # endpoint reconciler points the `kubernetes` Service at it), has it and the
    # Service's ClusterIP in its certificate, and the controller manager also runs
    # what Deployments and service-account tokens in pods need.
    pod_reachable_address: str = ""
    # kwok Stage definitions instead of build.sh's (e.g. pods that exit), and
    # more kube-controller-manager controllers (e.g. deployment, replicaset)
    kwok_stages: Path | None = None
    extra_controllers: tuple[str, ...] = ()

    url: str = ""
    token: str = ""
    kubeconfig: Path = field(default=Path())
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _owns_workdir: bool = False

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> ControlPlane:
        missing = missing_binaries(self.with_kwok and self.with_scheduler)
        if missing:
            raise RuntimeError(
                f"control-plane binaries missing: {', '.join(missing)}; run tests/cluster/build.sh "
                "or set KUBEBUILDER_ASSETS"
            )
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="jsbx-kube-"))
            self._owns_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        d = self.workdir
        assert d is not None
        pki = d / "pki"
        pki.mkdir(exist_ok=True)
        in_cluster = bool(self.pod_reachable_address)
        _write_pki(
            pki,
            (self.pod_reachable_address, KUBERNETES_SERVICE_IP) if in_cluster else (),
        )
        self.token = uuid.uuid4().hex
        (pki / "tokens.csv").write_text(f'{self.token},admin,admin-uid,"system:masters"\n')

        etcd_port, etcd_peer = free_ports(2)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                "--name=default",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        self._wait_http(f"{etcd_url}/health", timeout, "etcd")

        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                # all addresses only for in-cluster clients (TLS + token auth)
                f"--bind-address={'0.0.0.0' if in_cluster else '127.0.0.1'}",
                f"--secure-port={port}",
                f"--cert-dir={d / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                *(
                    [
                        f"--advertise-address={self.pod_reachable_address}",
                        "--endpoint-reconciler-type=lease",
                        # kubelet streaming (port-forward, logs): dial the node's
                        # address (its name does not resolve here), as a client
                        # the kubelet's x509 authenticator accepts
                        "--kubelet-preferred-address-types=InternalIP",
                        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                    ]
                    if in_cluster
                    else ["--endpoint-reconciler-type=none"]
                ),
                "--allow-privileged=true",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                "--v=0",
            ],
        )
        self.kubeconfig = d / "kubeconfig"
        self._write_kubeconfig(self.kubeconfig)
        self._wait_ready(timeout)

        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'kcm-certs'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token,"
                "persistentvolume-binder"
                + (
                    ",deployment,replicaset,endpointslice,root-ca-cert-publisher,"
                    # PVCs get the pvc-protection finalizer at admission: without
                    # its controller they, and so their namespace, never go away
                    "pvc-protection,pv-protection"
                    if in_cluster
                    else ""
                )
                + "".join(f",{c}" for c in self.extra_controllers),
                "--concurrent-gc-syncs=50",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=0",
            ],
        )
        if self.with_scheduler and find_binary("kube-scheduler"):
            self._spawn(
                "kube-scheduler",
                [
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    "--kube-api-qps=200",
                    "--kube-api-burst=400",
                    "--v=0",
                ],
            )
        kwok = find_binary("kwok")
        if self.with_kwok and self.with_scheduler and kwok is not None:
            stages = self.kwok_stages or kwok.parent / "kwok-stages.yaml"
            args = [
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=true",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.200.0.1",
                "--server-address=",
            ]
            if stages.is_file():
                args.append(f"--config={stages}")
            self._spawn("kwok", args)
            self._create_nodes()
        self.wait_namespace_ready("default", timeout)

    def stop(self) -> None:
        """Kill every process we started (SIGTERM, then SIGKILL) and drop the workdir."""
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        self.procs.clear()
        if self._owns_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_component(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop one process (e.g. ``kube-apiserver`` for an outage test), keeping the
        rest running; :meth:`start_component` starts it again with the same flags."""
        p = self.procs[name]
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)

    def start_component(self, name: str, timeout: float = 120) -> None:
        """Start a component stopped by :meth:`stop_component` (same port, certs and
        data); for the API server, wait until it is ready again."""
        p = self.procs[name]
        assert p.poll() is not None, f"{name} is still running"
        self._spawn(name, [str(a) for a in list(p.args)[1:]])  # type: ignore[arg-type]
        if name == "kube-apiserver":
            self._wait_ready(timeout)

    # -- helpers -----------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        exe = find_binary(name)
        assert exe is not None, name
        assert self.workdir is not None
        out = open(self.workdir / f"{name}.log", "ab") if self.log_to_files else subprocess.DEVNULL
        self.procs[name] = subprocess.Popen(
            [str(exe), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if not isinstance(out, int):  # a log file, not DEVNULL
            out.close()

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}; see {self.log_path(name)}")

    def log_path(self, name: str) -> Path:
        assert self.workdir is not None
        return self.workdir / f"{name}.log"

    def _wait_http(self, url: str, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not healthy after {timeout}s")
            time.sleep(0.2)

    def ssl_context(self) -> ssl.SSLContext:
        assert self.workdir is not None
        return ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict]:
        """Tiny authenticated request helper (used for readiness and setup)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": content_type},
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw[:1] == b"{" else {"raw": raw.decode()})
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"raw": raw.decode(errors="replace")}

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            self._check_alive()
            try:
                code, body = self.request("GET", "/readyz")
                if code == 200:
                    return
                last = str(body)[:300]
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise TimeoutError(f"kube-apiserver not ready after {timeout}s: {last}")
            time.sleep(0.25)

    def wait_namespace_ready(self, ns: str, timeout: float = 60) -> None:
        """A namespace is usable for pods once its default ServiceAccount exists."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            code, _ = self.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            if code == 200:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"default ServiceAccount in {ns} not created after {timeout}s")
            time.sleep(0.2)

    def _write_kubeconfig(self, path: Path) -> None:
        import yaml

        assert self.workdir is not None
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.workdir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(cfg))

    def _create_nodes(self) -> None:
        for i in range(self.nodes):
            name = f"kwok-node-{i}"
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                },
                "spec": {},
                "status": {
                    "allocatable": {"cpu": "1000", "memory": "1Ti", "pods": "5000"},
                    "capacity": {"cpu": "1000", "memory": "1Ti", "pods": "5000"},
                },
            }
            code, body = self.request("POST", "/api/v1/nodes", node)
            if code not in (201, 409):
                raise RuntimeError(f"creating node {name}: {code} {body}")
            # admission taints new nodes node.kubernetes.io/not-ready; the node
            # lifecycle controller would lift it once kwok reports Ready, but we
            # do not run that controller (it would also evict), so lift it here
            code, body = self.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"spec": {"taints": None}},
                content_type="application/merge-patch+json",
            )
            if code != 200:
                raise RuntimeError(f"untainting node {name}: {code} {body}")


def write_state(cp: ControlPlane, state_file: Path) -> None:
    state_file.write_text(
        json.dumps(
            {
                "url": cp.url,
                "kubeconfig": str(cp.kubeconfig),
                "workdir": str(cp.workdir),
                "pids": {n: p.pid for n, p in cp.procs.items()},
            }
        )
    )
