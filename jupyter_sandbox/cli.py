"""``jupyter-sandbox``: JupyterLab with sandboxed kernels; pools, claims and kernelspecs."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .control_plane.base import BackendUnavailable, ClaimError, ClaimNotFound
from .kernelspec import FILES_MODES

MANAGER_CLASS = "jupyter_sandbox.kernel_provisioner.manager.SandboxKernelManager"
# Subcommands that are programs of their own, with their own options.
# The extra of pyproject.toml each command's role needs (the rest: "jupyter").
EXTRA_OF_COMMAND = {
    "operator": "kubernetes",
    "router": "kubernetes",
    "claim-service": "kubernetes",
    "lab": "lab",
}
PASSTHROUGH = {
    "operator": "jupyter_sandbox.operator.__main__",
    "claim-service": "jupyter_sandbox.claim_service.__main__",
    "router": "jupyter_sandbox.router.__main__",
    "runtime": "jupyter_sandbox.runtime.__main__",
}


def _run(coro: Coroutine[Any, Any, int]) -> int:
    try:
        return asyncio.run(coro)
    except ClaimError as exc:
        print(
            f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr
        )
        return 2


def _plane() -> Any:
    from .control_plane.local.client import LocalControlPlane

    return LocalControlPlane()


def _print(data: Any, as_json: bool, table: Callable[[Any], None]) -> None:
    if as_json:
        print(json.dumps(data, indent=1, default=str))
    else:
        table(data)


# -- lab -----------------------------------------------------------------------


def cmd_lab(args: argparse.Namespace) -> int:
    from .kernelspec import install_kernelspec, kernelspec_name

    async def prepare(specs: list[str]) -> int:
        plane = _plane()
        # A daemon started here goes when this JupyterLab does (execv keeps the pid)
        # and its kernels are released; one that runs already is left as it is.
        plane.daemon_args += ["--exit-with", str(os.getpid())]
        info = await plane.ensure_daemon()
        pools = await plane.list_pools()
        print(
            f"jupyter-sandbox: daemon {info.get('pid')} (state in {info.get('state_dir')}), "
            f"router {info.get('router_url')}"
        )
        _print_isolation(info)
        for pool in pools:
            path = install_kernelspec(pool.name, display_name=pool.display_name or None)
            specs.append(kernelspec_name(pool.name))
            print(
                f"  pool {pool.name}: {pool.ready}/{pool.replicas} warm; "
                f"kernelspec {kernelspec_name(pool.name)} in {path}"
            )
        if info.get("isolation") == "none":
            print(
                f"WARNING: sandboxes are not isolated: {info.get('isolation_detail')}",
                file=sys.stderr,
            )
        if "not enforced" in str(info.get("limits", "")):
            print(f"WARNING: sandbox {info['limits']}", file=sys.stderr)
        await plane.close()
        return 0

    specs: list[str] = []
    if _run(prepare(specs)) != 0:
        return 2
    from .lab_defaults import (
        SANDBOX_ONLY,
        culling,
        default_kernel,
        from_config_files,
        sandbox_only,
    )

    lab_args = [arg for arg in args.lab_args if arg != SANDBOX_ONLY]
    # Only what the user set nowhere: a config file's setting is not overridden.
    configured = from_config_files()
    added, said = culling(lab_args, configured)
    # File > New: the default pool's kernel, else the first pool's
    preferred = kernelspec_name("default")
    if specs:
        added += default_kernel(lab_args, configured, preferred if preferred in specs else specs[0])
    print(said)
    if SANDBOX_ONLY in args.lab_args:
        added += sandbox_only(specs)
        print(f"  sandbox only: kernels {', '.join(specs)}; no terminal on this machine")
    sys.stdout.flush()
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        f"--ServerApp.kernel_manager_class={MANAGER_CLASS}",
        *added,
        *lab_args,
    ]
    os.execv(sys.executable, argv)
    return 0  # not reached


# -- kernelspecs ------------------------------------------------------------------


def cmd_install_kernelspec(args: argparse.Namespace) -> int:
    from .kernelspec import install_kernelspec

    if args.backend == "kubernetes" and not (args.namespace and args.router_url):
        print(
            "error: a Kubernetes kernelspec needs --namespace (where the pool's "
            "SandboxWarmPool is) and --router-url (how this server reaches the router)",
            file=sys.stderr,
        )
        return 2
    options: dict[str, Any] = {}
    if args.namespace:
        options["namespace"] = args.namespace
    if args.router_url:
        options["router_url"] = args.router_url
    try:
        path = install_kernelspec(
            args.pool,
            backend=args.backend,
            display_name=args.display_name,
            backend_options=options or None,
            user=args.user,
            prefix=args.prefix,
            name=args.name,
            files=args.files,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"installed kernelspec in {path}")
    if args.backend == "local" and not _run(_local_pool_exists(args.pool)):
        print(
            f"warning: the local daemon has no pool {args.pool!r} yet; kernels of this "
            f"kernelspec fail until you create it: jupyter-sandbox pool create {args.pool}",
            file=sys.stderr,
        )
    return 0


async def _local_pool_exists(pool: str) -> int:
    """1 if the running daemon has ``pool`` (or no daemon runs to ask), else 0."""
    plane = _plane()
    plane.autostart = False
    try:
        return int(any(p.name == pool for p in await plane.list_pools()))
    except BackendUnavailable:
        return 1  # nothing to check against; the daemon's default pool is "default"
    finally:
        await plane.close()


def cmd_uninstall_kernelspec(args: argparse.Namespace) -> int:
    from .kernelspec import kernelspec_name

    name = args.name or kernelspec_name(args.pool)
    removed = _remove_kernelspec(name)
    if not removed:
        print(f"error: no kernelspec {name!r} is installed", file=sys.stderr)
        return 2
    print(f"removed kernelspec {name} from {removed}")
    return 0


def _remove_kernelspec(name: str) -> str | None:
    """Remove an installed kernelspec; its directory, or None when there was none."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return str(KernelSpecManager().remove_kernel_spec(name))
    except (NoSuchKernel, KeyError):  # jupyter_client raises KeyError for an unknown name
        return None


# -- pools -------------------------------------------------------------------------


def cmd_pool(args: argparse.Namespace) -> int:
    async def go() -> int:
        plane = _plane()
        try:
            if args.pool_cmd == "list":
                pools = [p.to_json() for p in await plane.list_pools()]
                _print(pools, args.json, _pool_table)
            elif args.pool_cmd == "create":
                spec: dict[str, Any] = {"replicas": args.replicas, "network": not args.no_network}
                for option in ("memory_mb", "max_processes", "cpus", "tmp_mb", "disk_mb"):
                    if getattr(args, option) is not None:
                        spec[option] = getattr(args, option)
                if args.display_name:
                    spec["display_name"] = args.display_name
                if args.keep_workspace:
                    spec["keep_workspace"] = True
                if args.files is not None:
                    spec["files"] = args.files
                if args.requirements is not None:
                    spec["requirements"] = read_requirements(args.requirements)
                if args.no_pip_config:
                    spec["pip_config"] = False
                result = await plane.apply_pool(args.name, spec)
                if args.kernelspec:
                    from .kernelspec import install_kernelspec

                    install_kernelspec(args.name, display_name=args.display_name)
                _print(result, args.json, lambda r: print(f"pool {args.name} applied"))
            elif args.pool_cmd == "delete":
                from .kernelspec import kernelspec_name

                await plane.delete_pool(args.name)
                print(f"pool {args.name} deleted")
                spec_name = kernelspec_name(args.name)
                removed = _remove_kernelspec(spec_name)
                if removed:
                    print(f"kernelspec {spec_name} removed from {removed}")
        finally:
            await plane.close()
        return 0

    return _run(go())


def read_requirements(path: str) -> list[str]:
    """A requirements file's lines, for the pool spec (the daemon checks them).

    A relative ``--find-links`` directory is taken from the file's directory, as pip
    does: the daemon that installs them has no working directory of the user's.
    """
    from .control_plane.base import InvalidRequest

    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read requirements file {path}: {exc}") from None
    folder = os.path.dirname(os.path.abspath(path))
    result = []
    for line in lines:
        words = line.split()
        if len(words) == 2 and words[0] in ("-f", "--find-links") and "://" not in words[1]:
            line = f"{words[0]} {os.path.join(folder, words[1])}"
        result.append(line)
    return result


# -- claims ------------------------------------------------------------------------


def cmd_claims(args: argparse.Namespace) -> int:
    async def go() -> int:
        plane = _plane()
        try:
            if args.claims_cmd == "list":
                plane.autostart = False  # listing must not start a daemon and its pools
                try:
                    found = await plane.list_claims()
                except BackendUnavailable:
                    found = []
                    if not args.json:
                        print("no claims: the local sandbox daemon is not running")
                        return 0
                claims = [c.to_json() for c in found]
                for claim in claims:
                    claim.pop("endpoint", None)
                _print(
                    claims,
                    args.json,
                    _claims_table,
                )
            elif args.claims_cmd == "release":
                if await plane.status(args.name) is None:
                    raise ClaimNotFound(
                        f"claim {args.name!r} does not exist",
                        hint="see the claims with: jupyter-sandbox claims list",
                    )
                await plane.release(args.name)
                print(f"claim {args.name} released")
            elif args.claims_cmd == "suspend":
                status = await plane.suspend(args.name, force=args.force)
                print(f"claim {args.name}: {status.phase}")
            elif args.claims_cmd == "resume":
                status = await plane.resume(args.name)
                print(f"claim {args.name}: {status.phase}")
        finally:
            await plane.close()
        return 0

    return _run(go())


# -- daemon ------------------------------------------------------------------------


def cmd_daemon(args: argparse.Namespace) -> int:
    if args.daemon_cmd == "run":
        from .control_plane.local.daemon import main as daemon_main

        return daemon_main(args.daemon_args)

    async def go() -> int:
        plane = _plane()
        try:
            if args.daemon_cmd == "start":
                info = await plane.ensure_daemon()
                _print(info, getattr(args, "json", False), _daemon_text)
            elif args.daemon_cmd == "stop":
                plane.autostart = False
                try:
                    await plane.ensure_daemon()
                except BackendUnavailable:
                    print("daemon was not running")
                    return 0
                await plane.stop_daemon()
                print("daemon stopped")
            elif args.daemon_cmd == "status":
                plane.autostart = False
                try:
                    info = await plane.ensure_daemon()
                except ClaimError:
                    print("daemon not running")
                    return 1
                _print(info, getattr(args, "json", False), _daemon_text)
        finally:
            await plane.close()
        return 0

    return _run(go())


def _daemon_text(info: dict[str, Any]) -> None:
    """The daemon's info in words: who, since when, where, how it isolates."""
    import datetime

    started = float(info.get("started") or 0)
    since = datetime.datetime.fromtimestamp(started).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    up = int(max(0.0, time.time() - started))
    version = info.get("version")
    print(f"daemon {info.get('pid')} running since {since} (up {_duration(up)}), version {version}")
    print(f"  state: {info.get('state_dir')}")
    print(f"  router: {info.get('router_url')}")
    _print_isolation(info)


def _print_isolation(info: dict[str, Any]) -> None:
    """How the daemon isolates and limits sandboxes, each said once."""
    kind, detail = str(info.get("isolation")), str(info.get("isolation_detail") or "")
    # The detail usually names the kind itself ("bubblewrap: user, pid, ...").
    print(f"  isolation: {detail if detail.startswith(kind) else f'{kind}: {detail}'}")
    limits = str(info.get("limits") or "")
    if limits and limits not in detail:  # confined sandboxes' detail already says it
        print(f"  {limits}")  # "limits: ..."


def run_program(name: str, argv: list[str]) -> int:
    """Hand the rest of the command line to one of the PASSTHROUGH programs."""
    import importlib

    module = importlib.import_module(PASSTHROUGH[name])
    return int(module.main(argv) or 0)


def _pool_table(rows: list[dict[str, Any]]) -> None:
    def limit(settings: dict[str, Any], key: str, unit: str = "") -> str:
        value = settings.get(key)
        return "none" if value is None else f"{value:g}{unit}"

    shown = []
    for row in rows:
        settings = row.get("settings") or {}
        shown.append(
            {
                **row,
                "memory": limit(settings, "memory_mb", " MB"),
                "processes": limit(settings, "max_processes"),
                "disk": limit(settings, "disk_mb", " MB"),
                "network": "yes" if settings.get("network", True) else "no",
                "files": settings.get("files", "?"),
            }
        )
    columns = ["name", "replicas", "ready", "claimed", "memory", "processes", "disk"]
    _table(shown, [*columns, "network", "files", "isolation"])
    for row in rows:
        if row.get("message"):
            print(f"{row['name']}: {row['message']}")
    limits = {str(row.get("limits", "")) for row in rows}
    for line in sorted(text for text in limits if "not enforced" in text):
        print(f"note: {line}")


def _claims_table(rows: list[dict[str, Any]]) -> None:
    """Claims with their notebook's directory and age, in words."""
    shown = []
    for row in rows:
        age = int(max(0.0, time.time() - float(row.get("created") or time.time())))
        files = (row.get("resources") or {}).get("files_dir") or "-"
        shown.append({**row, "age": _duration(age), "notebook dir": files})
    _table(shown, ["name", "pool", "phase", "sandbox", "warm", "age", "notebook dir"])


def _duration(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c)).ljust(widths[c]) for c in columns))


DESCRIPTION = (
    "JupyterLab with kernels in sandboxes: local warm pools, claims and kernelspecs. "
    "Start with 'jupyter-sandbox lab'."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jupyter-sandbox", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # --json is accepted before or after the subcommand (`pool --json list`,
    # `pool list --json`); the leaf's copy sets nothing unless given.
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
    )

    lab = sub.add_parser(
        "lab",
        help="start JupyterLab with sandboxed kernels (local backend)",
        description="Start the local sandbox daemon (if it is not running), install a "
        "kernelspec for each of its pools, say how sandboxes are isolated and limited, and "
        "run JupyterLab with the suspend-on-cull kernel manager. Idle kernels are suspended "
        "after an hour and File > New makes a sandboxed notebook, unless your Jupyter "
        "config or the command line says otherwise. --sandbox-only offers only sandboxed "
        "kernels (any other kernel name is sandboxed too) and turns off the terminal, a "
        "shell on this machine. Every other argument goes to jupyter lab (e.g. --port "
        "9999 --no-browser).",
    )
    lab.add_argument("lab_args", nargs=argparse.REMAINDER, help="arguments for jupyter lab")
    lab.set_defaults(func=cmd_lab)

    ks = sub.add_parser("install-kernelspec", help="install a kernelspec for a pool")
    ks.add_argument("--pool", default="default")
    ks.add_argument("--backend", choices=["local", "kubernetes"], default="local")
    ks.add_argument("--display-name")
    ks.add_argument("--name", help="kernelspec name (default sandbox-<pool>)")
    ks.add_argument("--namespace", help="Kubernetes namespace of the pool")
    ks.add_argument("--router-url", help="router URL for the Kubernetes backend")
    ks.add_argument(
        "--files",
        choices=FILES_MODES,
        default="auto",
        help="how the kernel sees the notebook's directory: bind (mounted; local backend), "
        "copy (copied in at claim, changes copied back at suspend and shutdown), none; "
        "auto: bind on local, copy on Kubernetes",
    )
    where = ks.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for this user only")
    where.add_argument("--prefix", help="install under this prefix (default: sys.prefix)")
    ks.set_defaults(func=cmd_install_kernelspec)

    unks = sub.add_parser("uninstall-kernelspec", help="remove the kernelspec of a pool")
    unks.add_argument("--pool", default="default")
    unks.add_argument("--name", help="kernelspec name (default sandbox-<pool>)")
    unks.set_defaults(func=cmd_uninstall_kernelspec)

    pool = sub.add_parser("pool", help="list, create or delete local warm pools")
    pool.add_argument("--json", action="store_true", help="print JSON")
    pool_sub = pool.add_subparsers(dest="pool_cmd", required=True, metavar="ACTION")
    pool_sub.add_parser("list", parents=[as_json], help="pools and their warm sandboxes")
    create = pool_sub.add_parser(
        "create", parents=[as_json], help="create a pool, or change an existing one"
    )
    create.add_argument("name", help="the pool's name (its kernelspec is sandbox-NAME)")
    create.add_argument(
        "--replicas", type=int, default=2, help="warm sandboxes to keep ready (default 2)"
    )
    create.add_argument(
        "--no-network", action="store_true", help="loopback only: no network at all"
    )
    create.add_argument(
        "--memory-mb",
        type=int,
        help="memory limit, /tmp and /dev/shm included (a cgroup where available; "
        "default 4096 or half the machine where cgroups enforce it; 0: none)",
    )
    create.add_argument(
        "--max-processes", type=int, help="process and thread limit (default 1024; 0: none)"
    )
    create.add_argument("--cpus", type=float, help="CPU quota in cores (a cgroup)")
    create.add_argument("--tmp-mb", type=int, help="size of the private /tmp (default 1024)")
    create.add_argument(
        "--disk-mb",
        type=int,
        help="what a workspace may hold; the daemon measures it, and a claim over it "
        "says so in JupyterLab (default 10240; 0: no limit)",
    )
    create.add_argument("--display-name", help="the kernel's name in JupyterLab's launcher")
    create.add_argument(
        "--files",
        choices=("rw", "ro", "none"),
        help="the notebook's directory in the sandbox, as the kernel's working directory: "
        "read-write (default), read-only, or not at all (the kernel works in /workspace "
        "and claims come from the warm pool)",
    )
    create.add_argument(
        "--keep-workspace",
        action="store_true",
        help="keep a claim's workspace directory after it is released",
    )
    create.add_argument(
        "--requirements",
        metavar="FILE",
        help="a requirements file: installed once for the pool, read-only in its sandboxes "
        "(a notebook's %%pip install still wins); its lines are kept in the pool",
    )
    create.add_argument(
        "--no-pip-config",
        action="store_true",
        help="do not give the sandboxes this host's pip index, trusted hosts and CA bundle",
    )
    create.add_argument("--kernelspec", action="store_true", help="also install its kernelspec")
    delete = pool_sub.add_parser(
        "delete", parents=[as_json], help="delete a pool, its warm sandboxes and its kernelspec"
    )
    delete.add_argument("name")
    pool.set_defaults(func=cmd_pool)

    claims = sub.add_parser("claims", help="list, suspend, resume or release local claims")
    claims.add_argument("--json", action="store_true", help="print JSON")
    claims_sub = claims.add_subparsers(dest="claims_cmd", required=True, metavar="ACTION")
    claims_sub.add_parser("list", parents=[as_json], help="claims and their sandboxes")
    for action, text in (
        ("release", "delete a claim and its sandbox (its kernel dies)"),
        ("suspend", "stop a claim's sandbox, keeping its workspace and variables"),
        ("resume", "start a suspended claim's sandbox again"),
    ):
        action_parser = claims_sub.add_parser(action, parents=[as_json], help=text)
        action_parser.add_argument("name")
        if action == "suspend":
            action_parser.add_argument(
                "--force",
                action="store_true",
                help="even while its kernel runs a cell (that cell and the variables are lost)",
            )
    claims.set_defaults(func=cmd_claims)

    daemon = sub.add_parser("daemon", help="the local sandbox daemon")
    daemon_sub = daemon.add_subparsers(dest="daemon_cmd", required=True, metavar="ACTION")
    daemon_sub.add_parser("start", parents=[as_json], help="start it (it also starts on first use)")
    daemon_sub.add_parser("stop", help="stop it and every sandbox")
    daemon_sub.add_parser("status", parents=[as_json], help="whether it runs, and how it isolates")
    run = daemon_sub.add_parser("run", help="run in the foreground")
    run.add_argument("daemon_args", nargs=argparse.REMAINDER)
    daemon.set_defaults(func=cmd_daemon)

    for name, text in (
        ("operator", "run the Kubernetes operator"),
        ("router", "run the standalone router"),
        ("claim-service", "run the claim service for JupyterHub users' servers"),
        ("runtime", "run the in-sandbox runtime server"),
    ):
        passthrough = sub.add_parser(name, help=text, add_help=False)
        passthrough.add_argument("rest", nargs=argparse.REMAINDER)
        passthrough.set_defaults(func=lambda args: run_program(args.command, args.rest))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        from .utils.extras import missing_extra_message

        command = " ".join(["jupyter-sandbox", *argv[:1]])
        role = EXTRA_OF_COMMAND.get(argv[0] if argv else "")
        print(missing_extra_message(command, exc, role), file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    # These take their own options: argparse's REMAINDER would swallow or refuse
    # leading ``--flags`` (``jupyter-sandbox operator --leader-elect``), so hand over.
    if argv and argv[0] in PASSTHROUGH:
        return run_program(argv[0], argv[1:])
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # `lab` and `daemon run` pass options on; argparse's REMAINDER does not take ones
    # that come first (`jupyter-sandbox lab --port 9999`), so they arrive as unknown.
    if unknown and args.command == "lab":
        args.lab_args = [*unknown, *args.lab_args]
    elif unknown and args.command == "daemon" and args.daemon_cmd == "run":
        args.daemon_args = [*unknown, *args.daemon_args]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
