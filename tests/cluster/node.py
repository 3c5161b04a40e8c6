"""A real Kubernetes node on this machine: containerd + runc + CNI + kubelet.

Joins a :class:`~tests.cluster.controlplane.ControlPlane` (started without
kwok, which would otherwise claim the node) as one node that runs real pods:

* containerd v2 (``build.sh --node``) with its own root, state, socket and
  runc root under the node's work directory, the CRI plugin on overlayfs,
  NRI and the /opt plugin disabled, network namespaces under its state dir;
* runc and the CNI plugins (bridge, host-local, loopback) from Debian;
* a Linux bridge we create with the first address of the pod subnet, used by
  the CNI ``bridge`` plugin *without* ``isGateway``/``ipMasq``: pods get an
  address on the bridge's subnet and no default route, the host reaches them
  over the bridge, and the host's ``ip_forward`` and iptables are never touched;
* kubelet with a config file (cgroupfs driver, ``failCgroupV1: false`` on a
  cgroup v1 host, its own cgroup root, pod logs, root and cert dirs in the work
  directory, ``makeIPTablesUtilChains: false``), authenticating with the
  control plane's static token;
* the pause, runtime, operator and single-user images from
  :mod:`tests.cluster.images` (the others built from ``deploy/docker`` and
  ``deploy/jupyterhub`` by buildah), imported with ``ctr -n k8s.io images import``.

:meth:`Node.stop` (and :func:`teardown` from a state file) is idempotent and
leaves nothing behind: processes (kubelet, containerd, shims, every process
in the node's cgroups), mounts under the work dir, veths and the bridge,
cgroup directories, CNI cache entries and ``/var/log/containers`` links.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .controlplane import SERVICE_CIDR, ControlPlane, bin_dir, cache_root, free_ports

CONTAINERD_VERSION = os.environ.get("CONTAINERD_VERSION", "v2.2.9")
CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CONTAINER_LOGS = Path("/var/log/containers")  # hard-coded in the kubelet
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's default cache dir
SHIM_SOCKETS = Path("/run/containerd/s")  # hard-coded in containerd's shim code
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")  # hard-coded in the kubelet
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_POD_CIDR = os.environ.get("JSBX_NODE_POD_CIDR", "10.88.0.0/24")
# sysctls kube-proxy may set (restored by teardown)
KUBE_PROXY_SYSCTLS = (
    "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/bridge/bridge-nf-call-iptables",
)


def default_node_ip(pod_cidr: str = DEFAULT_POD_CIDR) -> str:
    """The bridge's (and so the node's) address: the first one of the pod subnet."""
    return str(next(ipaddress.ip_network(pod_cidr).hosts()))


def _read_sysctls() -> dict[str, str]:
    out = {}
    for k in KUBE_PROXY_SYSCTLS:
        try:
            out[k] = (Path("/proc/sys") / k).read_text().strip()
        except OSError:
            pass
    return out


def iptables_rules() -> list[str]:
    """Every rule and user chain (iptables-save, v4 and v6) for leak checks."""
    out = []
    for tool in ("iptables-save", "ip6tables-save"):
        exe = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
        if exe:
            r = _run(exe, check=False)
            out += [ln for ln in r.stdout.splitlines() if ln.startswith(("-A", ":KUBE"))]
    return out


def containerd_dir() -> Path:
    return cache_root() / f"containerd-{CONTAINERD_VERSION}" / "bin"


def cni_bin_dir() -> Path | None:
    for d in CNI_DIRS:
        if all((Path(d) / p).exists() for p in CNI_PLUGINS):
            return Path(d)
    return None


def runc_path() -> str | None:
    return shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin")


def missing_node_parts() -> list[str]:
    """What is missing to run a node, as human-readable hints (empty when ready)."""
    out = []
    if not (bin_dir() / "kubelet").exists():
        out.append("kubelet (tests/cluster/build.sh --node)")
    if not (bin_dir() / "pause").exists():
        out.append("pause (tests/cluster/build.sh --node)")
    for b in ("containerd", "ctr", "containerd-shim-runc-v2"):
        if not (containerd_dir() / b).exists():
            out.append(f"{b} (tests/cluster/build.sh --node)")
    if not runc_path():
        out.append("runc (apt-get install runc)")
    if not cni_bin_dir():
        out.append("CNI plugins (apt-get install containernetworking-plugins)")
    if not (bin_dir() / "kube-proxy").exists():
        out.append("kube-proxy (tests/cluster/build.sh --node)")
    if not shutil.which("iptables-restore", path=SYSTEM_PATH):
        out.append("iptables (apt-get install iptables)")
    for tool in ("ip", "debootstrap", "tar", "buildah"):
        if not shutil.which(tool) and not shutil.which(tool, path="/usr/sbin:/sbin"):
            out.append(f"{tool} (apt-get install {'iproute2' if tool == 'ip' else tool})")
    if os.geteuid() != 0:
        out.append("root")
    return out


def can_lower_oom_score() -> bool:
    """CAP_SYS_RESOURCE in our effective set (needed for a negative oom_score_adj)?"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))
    return False


def cgroup_v2_unified() -> bool:
    return _fstype("/sys/fs/cgroup") == "cgroup2"


def _fstype(path: str) -> str:
    best, fstype = "", ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mp = parts[4]
            sep = parts.index("-")
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
                best, fstype = mp, parts[sep + 1]
    return fstype


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup (v1 and v2) hierarchy."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[sep + 1] in ("cgroup", "cgroup2"):
                out.append(Path(parts[4]))
    return out


def _run(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for p in pids:
        try:
            os.kill(p, 0)
            alive.append(p)
        except ProcessLookupError:
            pass
        except PermissionError:
            alive.append(p)
    return alive


def _reap(pids: list[int]) -> None:
    for p in pids:
        try:
            os.waitpid(p, os.WNOHANG)
        except ChildProcessError:
            pass


def _kill(pids: list[int], timeout: float = 10.0, group: bool = True) -> None:
    """SIGTERM, wait, SIGKILL (process groups when ``group``)."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for p in _pids_alive(pids):
            try:
                os.killpg(p, sig) if group else os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pids)
            if not _pids_alive(pids):
                return
            time.sleep(0.1)


# --------------------------------------------------------------------------- state


@dataclass
class NodeState:
    """Everything teardown needs; written to ``<workdir>/node.json``."""

    name: str
    workdir: str
    bridge: str
    pod_cidr: str
    cgroup_root: str  # e.g. "jsbx-node", a directory in every cgroup hierarchy
    sock: str
    pids: dict[str, int] = field(default_factory=dict)
    shim_sockets_before: list[str] = field(default_factory=list)
    owns_workdir: bool = False
    # a control plane started only for this node (the pytest fixture's), stopped with it
    controlplane_workdir: str = ""
    # kube-proxy ran: teardown runs `kube-proxy --cleanup` and restores these sysctls
    kube_proxy: bool = False
    sysctls_before: dict[str, str] = field(default_factory=dict)


def teardown(st: NodeState) -> list[str]:
    """Remove everything the node made; idempotent.  Returns what it did."""
    done: list[str] = []
    work = Path(st.workdir)
    # 1. kubelet and containerd (their process groups)
    t0 = time.monotonic()
    # only processes whose command line names our work dir (pids get reused)
    pids = [
        p
        for n, p in st.pids.items()
        if n in ("kubelet", "containerd", "kube-proxy") and str(work).encode() in _cmdline(p)
    ]
    if _pids_alive(pids):
        # their state is thrown away below: no long graceful shutdown
        _kill(pids, timeout=2)
        done.append(f"stopped kubelet/containerd/kube-proxy ({time.monotonic() - t0:.1f}s)")
    # kube-proxy's iptables chains and rules (all of them are KUBE-*), its sysctls
    if st.kube_proxy:
        exe = bin_dir() / "kube-proxy"
        if exe.exists() and iptables_rules():
            env = dict(os.environ, PATH=SYSTEM_PATH)
            r = _run(str(exe), "--cleanup", "--v=0", check=False, env=env)
            done.append(f"kube-proxy --cleanup (exit {r.returncode})")
        n = _sweep_kube_chains()
        if n:
            done.append(f"removed {n} leftover KUBE-* iptables chains/rules")
        for k, v in st.sysctls_before.items():
            f = Path("/proc/sys") / k
            try:
                if f.read_text().strip() != v:
                    f.write_text(v)
                    done.append(f"restored {k}={v}")
            except OSError:
                pass
    # 2. every process in the node's cgroups (the pods' containers), then the
    #    shims that served this containerd (their command line names its socket)
    for _ in range(50):
        procs = _cgroup_procs(st.cgroup_root)
        if not procs:
            break
        for p in procs:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        done.append(f"killed {len(procs)} pod processes")
        time.sleep(0.1)
    shims = _shim_pids(st.sock)
    if shims:
        _kill(shims, timeout=2, group=False)
        done.append(f"killed {len(shims)} shims")
    # 3. mounts under the work dir (rootfs overlays, netns, shm, tmpfs volumes)
    for _ in range(3):
        mps = _mounts_under(work)
        if not mps:
            break
        for mp in sorted(mps, key=len, reverse=True):
            _run("umount", mp, check=False)
            if mp in _mounts_under(work):
                _run("umount", "-l", mp, check=False)
        done.append(f"unmounted {len(mps)}")
    # 4. network: veths on our bridge (their netns are gone now), the bridge
    if _link_exists(st.bridge):
        out = _run("ip", "-o", "link", "show", "master", st.bridge, check=False).stdout
        for line in out.splitlines():
            dev = line.split(":")[1].strip().split("@")[0]
            _run("ip", "link", "del", dev, check=False)
        _run("ip", "link", "del", st.bridge, check=False)
        done.append(f"deleted bridge {st.bridge}")
    # 5. cgroup directories (deepest first)
    for mnt in cgroup_mounts():
        root = mnt / st.cgroup_root
        if root.is_dir():
            subdirs = [p for p in root.rglob("*") if p.is_dir()]
            for d in sorted(subdirs, key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                root.rmdir()
            except OSError as e:
                done.append(f"cannot remove {root}: {e}")
    # 6. files outside the work dir that kubelet/containerd/CNI write
    if CONTAINER_LOGS.is_dir():
        for link in CONTAINER_LOGS.iterdir():
            try:
                if link.is_symlink() and os.readlink(link).startswith(str(work) + "/"):
                    link.unlink()
            except OSError:
                pass
    if CNI_CACHE.is_dir():  # results of our network and containerd's loopback one
        for f in CNI_CACHE.iterdir():
            try:
                if f.name.startswith(f"{st.name}-") or str(work) in f.read_text():
                    f.unlink()
            except OSError:
                pass
    (DEVICE_PLUGINS / "kubelet.sock").unlink(missing_ok=True)
    for d in (
        CONTAINER_LOGS,
        Path("/var/log/pods"),
        CNI_CACHE,
        CNI_CACHE.parent,
        DEVICE_PLUGINS,
        DEVICE_PLUGINS.parent,
    ):
        try:
            d.rmdir()  # only if empty: the kubelet / CNI made them for us
        except OSError:
            pass
    if SHIM_SOCKETS.is_dir():
        bound = _bound_unix_sockets()
        for f in SHIM_SOCKETS.iterdir():
            if f.name not in st.shim_sockets_before and str(f) not in bound:
                f.unlink(missing_ok=True)
        for d in (SHIM_SOCKETS, SHIM_SOCKETS.parent):
            try:
                d.rmdir()  # only if empty (and so, only if we made it)
            except OSError:
                break
    if st.owns_workdir:
        shutil.rmtree(work, ignore_errors=True)
    if st.controlplane_workdir:
        done += _stop_controlplane(Path(st.controlplane_workdir))
    done.append(f"teardown took {time.monotonic() - t0:.1f}s")
    return done


def _sweep_kube_chains() -> int:
    """What ``kube-proxy --cleanup`` leaves (e.g. KUBE-FIREWALL in filter): every
    jump to a KUBE-* chain, then the KUBE-* chains (v4 and v6).  Returns the count."""
    import shlex

    count = 0
    for save, tool in (("iptables-save", "iptables"), ("ip6tables-save", "ip6tables")):
        exe = shutil.which(save, path=SYSTEM_PATH)
        tool_exe = shutil.which(tool, path=SYSTEM_PATH)
        if not exe or not tool_exe:
            continue
        table, chains = "", {}
        for line in _run(exe, check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                chains.setdefault(table, []).append(line[1:].split()[0])
            elif line.startswith("-A ") and " -j KUBE-" in line:
                args = shlex.split(line)
                if not args[1].startswith("KUBE-"):
                    _run(tool_exe, "-w", "-t", table, "-D", *args[1:], check=False)
                    count += 1
        for table, names in chains.items():
            for c in names:
                _run(tool_exe, "-w", "-t", table, "-F", c, check=False)
            for c in names:
                _run(tool_exe, "-w", "-t", table, "-X", c, check=False)
                count += 1
    return count


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _stop_controlplane(workdir: Path) -> list[str]:
    """Kill a control plane left behind by a killed test run (every process
    whose command line names its work dir), then remove the dir."""
    key = str(workdir).encode()
    pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]
    pids = [p for p in pids if key in _cmdline(p) and p != os.getpid()]
    if pids:
        _kill(pids, timeout=2, group=False)
    shutil.rmtree(workdir, ignore_errors=True)
    return [f"stopped {len(pids)} control-plane processes"] if pids else []


def orphaned_states() -> list[NodeState]:
    """Node states of test runs that died without tearing down (temp dirs)."""
    out = []
    for f in Path(tempfile.gettempdir()).glob("jsbx-node-*/node.json"):
        try:
            out.append(NodeState(**json.loads(f.read_text())))
        except (OSError, ValueError, TypeError):
            pass
    return out


def _cgroup_procs(cg_root: str) -> list[int]:
    pids: set[int] = set()
    for mnt in cgroup_mounts():
        root = mnt / cg_root
        if not root.is_dir():
            continue
        for f in root.rglob("cgroup.procs"):
            try:
                pids.update(int(x) for x in f.read_text().split())
            except OSError:
                pass
    pids.discard(os.getpid())
    return sorted(pids)


def _shim_pids(sock: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in cmd:
            out.append(int(d.name))
    return out


def _bound_unix_sockets() -> set[str]:
    out = set()
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8:
                out.add(parts[7].lstrip("@"))
    except OSError:
        pass
    return out


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return out


def _link_exists(dev: str) -> bool:
    return _run("ip", "link", "show", dev, check=False).returncode == 0


# --------------------------------------------------------------------------- node


@dataclass
class Node:
    """One real node joined to ``controlplane``.  ``start()``/``stop()``."""

    controlplane: ControlPlane
    name: str = "jsbx-node"
    # not kwok's 10.244.0.0/16: fake pod IPs of other test clusters on this
    # machine must never reach a real pod here
    pod_cidr: str = DEFAULT_POD_CIDR
    bridge: str = "jsbx0"
    workdir: Path | None = None
    import_images: bool = True
    # set when the control plane exists only for this node: a teardown from the
    # state file (after the test process was killed) then stops it too
    controlplane_owned: bool = False
    # kube-proxy (iptables mode) for ClusterIPs, e.g. the `kubernetes` Service that
    # in-cluster clients use; pods then get a route to the service range via the
    # bridge address.  Needs a control plane with ``pod_reachable_address``.
    kube_proxy: bool = False

    state: NodeState | None = None
    images: dict[str, str] = field(default_factory=dict)  # "runtime"/"pause" -> image ref
    timings: dict[str, float] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def node_ip(self) -> str:
        return default_node_ip(self.pod_cidr)

    @property
    def sock(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "containerd" / "containerd.sock"

    def log_path(self, name: str) -> Path:
        assert self.workdir is not None
        return self.workdir / f"{name}.log"

    # -- lifecycle ---------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> Node:
        missing = missing_node_parts()
        if missing:
            raise RuntimeError("cannot start a node; missing: " + ", ".join(missing))
        owns = self.workdir is None
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="jsbx-node-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state = NodeState(
            name=self.name,
            workdir=str(self.workdir),
            bridge=self.bridge,
            pod_cidr=self.pod_cidr,
            cgroup_root=self.name,
            sock=str(self.sock),
            shim_sockets_before=sorted(p.name for p in SHIM_SOCKETS.glob("*"))
            if SHIM_SOCKETS.is_dir()
            else [],
            owns_workdir=owns,
            kube_proxy=self.kube_proxy,
            sysctls_before=_read_sysctls() if self.kube_proxy else {},
            controlplane_workdir=str(self.controlplane.workdir)
            if self.controlplane_owned and self.controlplane.workdir
            else "",
        )
        self._save_state()
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[str]:
        if self.state is None:
            return []
        self.state.pids = {n: p.pid for n, p in self.procs.items()} | self.state.pids
        done = teardown(self.state)
        for p in self.procs.values():
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()
        self.state = None
        return done

    def _save_state(self) -> None:
        assert self.state is not None and self.workdir is not None
        (self.workdir / "node.json").write_text(json.dumps(asdict(self.state), indent=1))

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        assert self.state is not None
        with open(self.log_path(name), "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.state.pids[name] = self.procs[name].pid
        self._save_state()

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = self.log_path(name).read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{tail}")

    def _start(self, timeout: float) -> None:
        from . import images

        t0 = time.monotonic()
        pause = images.pause_image()
        runtime = images.runtime_image()
        wanted = [pause, runtime]
        self.images = {"pause": pause.name, "runtime": runtime.name}
        if self.kube_proxy:  # pods can use the API: our operator/router image too
            operator = images.operator_image()
            singleuser = images.singleuser_image()
            wanted += [operator, singleuser]
            self.images["operator"] = operator.name
            self.images["singleuser"] = singleuser.name
        self.timings["images"] = time.monotonic() - t0

        t = time.monotonic()
        self._setup_bridge()
        self._setup_cgroups()
        self._start_containerd(pause.name)
        self.timings["containerd"] = time.monotonic() - t
        if self.import_images:
            t = time.monotonic()
            for img in wanted:
                # --local: read the archive in ctr, not streamed through the
                # transfer service (measured ~2x faster here)
                self.ctr(
                    "images", "import", "--local", "--platform", "linux/amd64", str(img.archive)
                )
            self.timings["import"] = time.monotonic() - t
        t = time.monotonic()
        self._start_kubelet()
        self._wait_node_ready(timeout)
        self.timings["kubelet"] = time.monotonic() - t
        if self.kube_proxy:
            t = time.monotonic()
            self._start_kube_proxy()
            self._wait_kube_proxy(timeout)
            self.timings["kube-proxy"] = time.monotonic() - t
        self.timings["total"] = time.monotonic() - t0

    # -- pieces ------------------------------------------------------------------

    def _setup_bridge(self) -> None:
        if _link_exists(self.bridge):
            _run("ip", "link", "del", self.bridge)
        net = ipaddress.ip_network(self.pod_cidr)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.node_ip}/{net.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def _setup_cgroups(self) -> None:
        """The kubelet's cgroup root must exist in every hierarchy (v1: with
        cpuset.cpus/mems filled in, or no task can join below it)."""
        assert self.state is not None
        for mnt in cgroup_mounts():
            d = mnt / self.state.cgroup_root
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (d / f).exists() and not (d / f).read_text().strip():
                    (d / f).write_text((mnt / f).read_text())

    def _start_containerd(self, pause_image: str) -> None:
        assert self.workdir is not None
        d = self.workdir / "containerd"
        for sub in ("root", "state", "runc"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        net = ipaddress.ip_network(self.pod_cidr)
        hosts = list(net.hosts())
        conflist = {
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [
                                {
                                    "subnet": str(net),
                                    "rangeStart": str(hosts[9]),
                                    "rangeEnd": str(hosts[-1]),
                                    "gateway": self.node_ip,
                                }
                            ]
                        ],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                        # only the service range goes via the host (kube-proxy's
                        # DNAT there); still no default route
                        "routes": [{"dst": SERVICE_CIDR, "gw": self.node_ip}]
                        if self.kube_proxy
                        else [],
                    },
                }
            ],
        }
        (cni_conf / "10-jsbx.conflist").write_text(json.dumps(conflist, indent=1))
        restrict_oom = not can_lower_oom_score()
        cfg = f"""version = 3
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.opt",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
]

[grpc]
  address = "{self.sock}"

[ttrpc]
  address = "{self.sock}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_image}"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # kubelet asks for oom_score_adj -998 (sandboxes) and -997 (Guaranteed pods);
  # lowering it needs CAP_SYS_RESOURCE, which a VM/container may lack (this one
  # does): clamp to containerd's own score instead of failing every pod
  restrict_oom_score_adj = {str(restrict_oom).lower()}
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc_path()}"
        Root = "{d / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin_dir()}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        (d / "config.toml").write_text(cfg)
        env = dict(os.environ)
        env["PATH"] = f"{containerd_dir()}:{SYSTEM_PATH}"
        self._spawn(
            "containerd",
            [str(containerd_dir() / "containerd"), "--config", str(d / "config.toml")],
            env=env,
        )
        deadline = time.monotonic() + 60
        while True:
            self._check_alive()
            if self.sock.exists() and self.ctr("version", check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("containerd did not come up")
            time.sleep(0.1)

    def ctr(self, *args: str, check: bool = True, namespace: str = "k8s.io"):
        return _run(
            str(containerd_dir() / "ctr"),
            "--address",
            str(self.sock),
            "-n",
            namespace,
            *args,
            check=check,
        )

    def _start_kubelet(self) -> None:
        assert self.workdir is not None and self.state is not None
        cp = self.controlplane
        k = self.workdir / "kubelet"
        (k / "root").mkdir(parents=True, exist_ok=True)
        (k / "logs").mkdir(parents=True, exist_ok=True)
        shutil.copy(cp.kubeconfig, k / "kubeconfig")
        kubelet_port, healthz_port = free_ports(2)
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": "/" + self.state.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "address": self.node_ip,
            "port": kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(cp.workdir / "pki" / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(k / "logs"),
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            "failSwapOn": False,
            # the kubelet's own score (default -999): see restrict_oom_score_adj
            "oomScoreAdj": -999 if can_lower_oom_score() else 0,
            "registerNode": True,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "1h",
            "httpCheckFrequency": "1h",
            "volumeStatsAggPeriod": "0s",
        }
        if cgroup_v2_unified():
            cfg.pop("failCgroupV1")
        (k / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.state.pids.pop("kubelet", None)
        self._spawn(
            "kubelet",
            [
                str(bin_dir() / "kubelet"),
                f"--config={k / 'config.yaml'}",
                f"--kubeconfig={k / 'kubeconfig'}",
                f"--root-dir={k / 'root'}",
                f"--cert-dir={k / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.node_ip}",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        """kube-proxy in iptables mode (iptables from Debian), nodeports only on
        the bridge address, no conntrack sysctl changes."""
        assert self.workdir is not None and self.state is not None
        k = self.workdir / "kube-proxy"
        k.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.controlplane.kubeconfig, k / "kubeconfig")
        proxy_ports = free_ports(2)
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(k / "kubeconfig")},
            "hostnameOverride": self.name,
            "bindAddress": self.node_ip,
            "clusterCIDR": self.pod_cidr,
            "healthzBindAddress": f"127.0.0.1:{proxy_ports[0]}",
            "metricsBindAddress": f"127.0.0.1:{proxy_ports[1]}",
            "nodePortAddresses": [f"{self.node_ip}/32"],
            # 0: leave the host's conntrack table size and timeouts alone
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"syncPeriod": "30s", "minSyncPeriod": "0s"},
        }
        (k / "config.yaml").write_text(yaml.safe_dump(cfg))
        self._spawn(
            "kube-proxy",
            [str(bin_dir() / "kube-proxy"), f"--config={k / 'config.yaml'}", "--v=1"],
            env=dict(os.environ, PATH=SYSTEM_PATH),
        )

    def _wait_kube_proxy(self, timeout: float) -> None:
        """Until the `kubernetes` Service's DNAT rule is in place."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            if any("default/kubernetes:https" in r for r in iptables_rules()):
                return
            if time.monotonic() > deadline:
                tail = self.log_path("kube-proxy").read_text(errors="replace")[-3000:]
                raise TimeoutError(f"kube-proxy: no rule for default/kubernetes:\n{tail}")
            time.sleep(0.25)

    def _wait_node_ready(self, timeout: float) -> None:
        cp = self.controlplane
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            self._check_alive()
            code, node = cp.request("GET", f"/api/v1/nodes/{self.name}")
            if code == 200:
                conds = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
                ready = conds.get("Ready", {})
                last = f"{ready.get('reason')}: {ready.get('message')}"
                if ready.get("status") == "True":
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.name} not Ready after {timeout}s ({last})")
            time.sleep(0.25)
        # admission taints a new node not-ready; the node lifecycle controller
        # would lift it (but also evicts), and we do not run it: lift it here
        code, body = cp.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}",
            {"spec": {"taints": None}},
            content_type="application/merge-patch+json",
        )
        if code != 200:
            raise RuntimeError(f"untainting node {self.name}: {code} {body}")


def load_state(workdir: Path) -> NodeState | None:
    f = workdir / "node.json"
    if not f.exists():
        return None
    return NodeState(**json.loads(f.read_text()))
