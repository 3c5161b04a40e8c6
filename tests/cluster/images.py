"""Container images for the real-node test cluster, built without a registry.

Three images, written as OCI image-layout archives that ``ctr images import``
reads (nothing here talks to a container registry):

* ``runtime``: a minimal Debian root made with ``debootstrap --variant=minbase``
  (python3 from Debian, the same suite as the host), this package's runtime
  dependencies installed into it from PyPI with the host's pip (same Python
  minor, same glibc), plus a second, small layer with the ``jupyter_sandbox``
  sources of this checkout.  Its default command is the sandbox runtime
  (``python -m jupyter_sandbox.runtime --port 8888 --workspace /workspace``),
  user 1000, like ``deploy/docker/Dockerfile.runtime``.
* ``pause``: one layer holding the static ``pause`` binary that
  ``build.sh --node`` compiles from ``tests/cluster/pause``.

Everything is cached under ``$JUPYTER_SANDBOX_CACHE/images`` keyed by its
inputs: the base layer by (suite, mirror, Debian packages, pip requirements,
recipe version), the source layer by the hash of the package files, the
archives by the layer digests.  A warm run only re-hashes the sources.

    python -m tests.cluster.images            # build all three, print the archive paths
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .controlplane import bin_dir, cache_root

REPO = Path(__file__).resolve().parents[2]
RECIPE_VERSION = "1"
RUNTIME_REPO = "jupyter-sandbox.local/runtime"
PAUSE_REPO = "jupyter-sandbox.local/pause"
OPERATOR_REPO = "jupyter-sandbox.local/operator"
# python-is-python3: the pod command is `python -m ...`, as in the Dockerfile
DEBIAN_PACKAGES = ("python3", "python-is-python3")
PY_SITE = "usr/local/lib/python3.11/dist-packages"
CMD = ["python", "-m", "jupyter_sandbox.runtime", "--port", "8888", "--workspace", "/workspace"]

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"  # uncompressed: no gzip time


def log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def images_dir() -> Path:
    d = cache_root() / "images"
    (d / "blobs").mkdir(parents=True, exist_ok=True)
    return d


def _sha(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------- inputs


def apt_mirror() -> str:
    """The Debian mirror the host's apt uses (``DEBIAN_MIRROR`` overrides)."""
    env = os.environ.get("DEBIAN_MIRROR")
    if env:
        return env
    srcs = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for f in srcs:
        for m in re.finditer(r"^URIs:\s*(\S+)", f.read_text(), re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
    lst = Path("/etc/apt/sources.list")
    if lst.exists():
        for m in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s", lst.read_text(), re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
    raise RuntimeError("no Debian mirror in the apt sources; set DEBIAN_MIRROR")


def debian_suite() -> str:
    env = os.environ.get("DEBIAN_SUITE")
    if env:
        return env
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    return "bookworm"


def _req_name(spec: str) -> str:
    return re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower()


def _full_default() -> bool:
    return bool(os.environ.get("JSBX_IMAGE_FULL"))


def pip_requirements(full: bool | None = None) -> list[str]:
    """Requirement specifiers from pyproject.toml: the base install, which is the
    sandbox runtime's (as deploy/docker/Dockerfile.runtime installs it); ``full``
    adds the ``kubernetes`` extra, for the operator and the router."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    if _full_default() if full is None else full:
        extra = data["project"]["optional-dependencies"]["kubernetes"]
        reqs += [r for r in extra if _req_name(r) not in {_req_name(b) for b in reqs}]
    return sorted(reqs)


def console_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: name -> "module:function"."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(data["project"].get("scripts", {}))


def package_version() -> str:
    m = re.search(r"['\"]([^'\"]+)['\"]", (REPO / "jupyter_sandbox" / "_version.py").read_text())
    return m.group(1) if m else "0"


def source_files() -> list[Path]:
    root = REPO / "jupyter_sandbox"
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_dir() or "__pycache__" in rel.parts or rel.parts[0] == "labextension":
            continue
        if p.suffix in (".pyc", ".pyo"):
            continue
        out.append(p)
    return out


# --------------------------------------------------------------------------- layers


@dataclass
class Blob:
    digest: str  # "sha256:..."
    size: int
    path: Path


def _store_stream(src, tmp: Path) -> Blob:
    """Copy ``src`` (a binary stream) to the blob store, hashing on the way."""
    h = hashlib.sha256()
    size = 0
    with open(tmp, "wb") as out:
        while chunk := src.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
            size += len(chunk)
    dest = images_dir() / "blobs" / h.hexdigest()
    os.replace(tmp, dest)
    return Blob(f"sha256:{h.hexdigest()}", size, dest)


def _store_bytes(data: bytes) -> Blob:
    hexd = hashlib.sha256(data).hexdigest()
    dest = images_dir() / "blobs" / hexd
    if not dest.exists():
        dest.write_bytes(data)
    return Blob(f"sha256:{hexd}", len(data), dest)


def _blob_from_meta(meta_file: Path) -> Blob | None:
    if not meta_file.exists():
        return None
    meta = json.loads(meta_file.read_text())
    p = images_dir() / "blobs" / meta["digest"].split(":", 1)[1]
    if not p.exists() or p.stat().st_size != meta["size"]:
        return None
    return Blob(meta["digest"], meta["size"], p)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return out


def _unmount_all(root: Path) -> None:
    for mp in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], check=False)


def base_layer_key(full: bool | None = None) -> str:
    return _sha(
        RECIPE_VERSION,
        debian_suite(),
        apt_mirror(),
        ",".join(DEBIAN_PACKAGES),
        ",".join(pip_requirements(full)),
        f"{sys.version_info.major}.{sys.version_info.minor}",
    )[:16]


def base_layer(full: bool | None = None) -> Blob:
    """debootstrap + pip, packed as one uncompressed layer (cached).  ``full``
    (default: ``JSBX_IMAGE_FULL``) installs all of the package's dependencies."""
    reqs = pip_requirements(full)
    key = base_layer_key(full)
    meta_file = images_dir() / f"base-{key}.json"
    blob = _blob_from_meta(meta_file)
    if blob:
        return blob
    for tool in ("debootstrap", "tar"):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} not found (apt-get install {tool})")
    work = images_dir() / f"tmp-base-{key}"
    root = work / "root"
    _unmount_all(work)
    shutil.rmtree(work, ignore_errors=True)
    root.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        suite, mirror = debian_suite(), apt_mirror()
        log(f"debootstrap {suite} (minbase + {', '.join(DEBIAN_PACKAGES)})")
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                suite,
                str(root),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        _unmount_all(root)
        t1 = time.monotonic()
        log(f"debootstrap took {t1 - t0:.0f}s; pip install {len(reqs)} requirements")
        site = root / PY_SITE
        site.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--no-warn-conflicts",
                "--only-binary=:all:",
                "--target",
                str(site),
                *reqs,
            ],
            check=True,
        )
        freeze = subprocess.run(
            [sys.executable, "-m", "pip", "list", "--path", str(site), "--format=freeze"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        # console scripts pip wrote point at the host's interpreter: not used, drop
        shutil.rmtree(site / "bin", ignore_errors=True)
        _finish_root(root)
        t2 = time.monotonic()
        log(f"pip took {t2 - t1:.0f}s; packing the layer")
        proc = subprocess.Popen(
            [
                "tar",
                "--numeric-owner",
                "--sort=name",
                "--xattrs",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "-C",
                str(root),
                "-cf",
                "-",
                ".",
            ],
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        blob = _store_stream(proc.stdout, work / "layer.tar")
        if proc.wait() != 0:
            raise RuntimeError("tar of the base root failed")
        log(f"base layer {blob.digest[:19]} {blob.size >> 20} MiB in {time.monotonic() - t2:.0f}s")
        meta_file.write_text(
            json.dumps({"digest": blob.digest, "size": blob.size, "pip": freeze.split()}, indent=1)
        )
        return blob
    finally:
        _unmount_all(work)
        shutil.rmtree(work, ignore_errors=True)


def _finish_root(root: Path) -> None:
    """User 1000 (jovyan) with a home and /workspace, as in the Dockerfile; trim docs."""
    with open(root / "etc/passwd", "a") as f:
        f.write("jovyan:x:1000:1000::/home/jovyan:/bin/sh\n")
    with open(root / "etc/group", "a") as f:
        f.write("jovyan:x:1000:\n")
    for d in ("home/jovyan", "workspace"):
        (root / d).mkdir(parents=True, exist_ok=True)
        os.chown(root / d, 1000, 1000)
    for d in (
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/cache/apt",
        "var/lib/apt/lists",
        "var/log",
    ):
        p = root / d
        if p.is_dir():
            for child in p.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    # debootstrap copies the host's resolv.conf; pods get theirs from the kubelet
    (root / "etc/resolv.conf").unlink(missing_ok=True)


def _tar_bytes(entries: list[tuple[str, bytes | None, int]]) -> bytes:
    """A deterministic tar: (path, data or None for a directory, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data, mode in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            ti.mode = mode
            if data is None:
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]


def source_layer() -> Blob:
    """jupyter_sandbox/ of this checkout plus a minimal dist-info (entry points)."""
    ver = package_version()
    entries: dict[str, tuple[bytes | None, int]] = {}

    def add(path: str, data: bytes, mode: int = 0o644) -> None:
        for d in _parents(path):
            entries.setdefault(d, (None, 0o755))
        entries[path] = (data, mode)

    for f in source_files():
        add(f"{PY_SITE}/{f.relative_to(REPO).as_posix()}", f.read_bytes())
    di = f"{PY_SITE}/jupyter_sandbox-{ver}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: jupyter-sandbox\nVersion: {ver}\n"
    add(f"{di}/METADATA", meta.encode())
    add(f"{di}/INSTALLER", b"tests/cluster/images.py\n")
    add(
        f"{di}/entry_points.txt",
        b"[jupyter_client.kernel_provisioners]\n"
        b"sandbox-provisioner = "
        b"jupyter_sandbox.kernel_provisioner.provisioner:SandboxProvisioner\n",
    )
    data = _tar_bytes([(p, d, m) for p, (d, m) in sorted(entries.items())])
    return _store_bytes(data)


def scripts_layer() -> Blob:
    """``/usr/local/bin/<name>`` for each console script (what pip would write,
    with the image's interpreter), e.g. ``jupyter-sandbox`` for the operator image."""
    entries: list[tuple[str, bytes | None, int]] = [
        ("usr", None, 0o755),
        ("usr/local", None, 0o755),
        ("usr/local/bin", None, 0o755),
    ]
    for name, target in sorted(console_scripts().items()):
        mod, func = target.split(":", 1)
        script = f"#!/usr/bin/python3\nimport sys\nfrom {mod} import {func}\nsys.exit({func}())\n"
        entries.append((f"usr/local/bin/{name}", script.encode(), 0o755))
    return _store_bytes(_tar_bytes(entries))


def pause_layer() -> Blob:
    exe = bin_dir() / "pause"
    if not exe.exists():
        raise RuntimeError(f"{exe} missing: run tests/cluster/build.sh --node")
    return _store_bytes(_tar_bytes([("pause", exe.read_bytes(), 0o755)]))


# --------------------------------------------------------------------------- images


@dataclass
class Image:
    name: str  # full reference, e.g. jupyter-sandbox.local/runtime:0123abcd
    archive: Path  # OCI image-layout tar for `ctr images import`


def _write_image(repo: str, layers: list[Blob], config: dict, created_by: list[str]) -> Image:
    cfg = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [b.digest for b in layers]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": c} for c in created_by],
    }
    cfg_blob = _store_bytes(json.dumps(cfg, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": cfg_blob.digest, "size": cfg_blob.size},
        "layers": [{"mediaType": MT_LAYER, "digest": b.digest, "size": b.size} for b in layers],
    }
    man_blob = _store_bytes(json.dumps(manifest, sort_keys=True).encode())
    tag = man_blob.digest.split(":", 1)[1][:16]
    name = f"{repo}:{tag}"
    archive = images_dir() / f"{repo.rsplit('/', 1)[1]}-{tag}.oci.tar"
    if archive.exists():
        return Image(name, archive)
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": man_blob.digest,
                "size": man_blob.size,
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:

        def add_bytes(n: str, data: bytes) -> None:
            ti = tarfile.TarInfo(n)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tf.addfile(ti, io.BytesIO(data))

        add_bytes("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_bytes("index.json", json.dumps(index).encode())
        for b in [cfg_blob, man_blob, *layers]:
            ti = tf.gettarinfo(str(b.path), arcname=f"blobs/sha256/{b.digest.split(':', 1)[1]}")
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
            with open(b.path, "rb") as f:
                tf.addfile(ti, f)
    os.replace(tmp, archive)
    # older archives of this image are whole copies of their layers: drop them
    for old in images_dir().glob(f"{repo.rsplit('/', 1)[1]}-*.oci.tar"):
        if old != archive:
            old.unlink(missing_ok=True)
    return Image(name, archive)


def runtime_image() -> Image:
    base = base_layer()
    src = source_layer()
    return _write_image(
        RUNTIME_REPO,
        [base, src],
        {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/home/jovyan",
                "PYTHONUNBUFFERED=1",
            ],
            "User": "1000:1000",
            "WorkingDir": "/workspace",
            "Cmd": CMD,
            "ExposedPorts": {"8888/tcp": {}},
        },
        [
            f"debootstrap --variant=minbase {debian_suite()} + pip install (package dependencies)",
            "jupyter_sandbox sources",
        ],
    )


def operator_image() -> Image:
    """What ``deploy/docker/Dockerfile.operator`` builds: all dependencies, the
    package with its console scripts, user 65532, ``jupyter-sandbox operator``
    (the router Deployment runs ``jupyter-sandbox router`` in the same image)."""
    return _write_image(
        OPERATOR_REPO,
        [base_layer(full=True), source_layer(), scripts_layer()],
        {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONUNBUFFERED=1",
            ],
            "User": "65532:65532",
            "Cmd": ["jupyter-sandbox", "operator"],
            "ExposedPorts": {"8080/tcp": {}},
        },
        [
            f"debootstrap --variant=minbase {debian_suite()} + pip install (all dependencies)",
            "jupyter_sandbox sources",
            "console scripts",
        ],
    )


def pause_image() -> Image:
    return _write_image(
        PAUSE_REPO,
        [pause_layer()],
        {"Entrypoint": ["/pause"], "User": "65535:65535"},
        ["pause (tests/cluster/pause)"],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cluster.images")
    p.add_argument("which", nargs="*", default=["pause", "runtime", "operator"])
    a = p.parse_args(argv)
    for w in a.which:
        t0 = time.monotonic()
        img = {"pause": pause_image, "runtime": runtime_image, "operator": operator_image}[w]()
        log(f"{w}: {img.name} ({time.monotonic() - t0:.1f}s)")
        print(img.name, img.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
