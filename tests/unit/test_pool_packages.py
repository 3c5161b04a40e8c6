"""A pool's requirement lines, the pip settings sandboxes get, and where the pool's
packages may be bound: the rules, table-driven."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.base import InvalidRequest
from jupyter_sandbox.control_plane.local.isolation import UnsafeMount, check_pool_packages
from jupyter_sandbox.control_plane.local.model import PoolSpec
from jupyter_sandbox.control_plane.local.packages import (
    check_requirements,
    effective_settings,
    forwarding,
    has_credentials,
    requirements_hash,
)


@pytest.mark.parametrize(
    "line",
    [
        "numpy",
        "numpy==2.1.0",
        "pandas>=2; python_version >= '3.10'",
        "requests[socks] ~= 2.32",
        "pkg==1.0 --hash=sha256:0123abcd",
        "--no-index",
        "--find-links /srv/wheels",
        "-f /srv/wheels",
        "--find-links=https://example.org/wheels/",
        "--index-url https://example.org/simple",
        "-i https://example.org/simple",
        "--extra-index-url https://example.org/extra",
        "--trusted-host example.org",
        "--pre",
        "--only-binary :all:",
        "--pre --prefer-binary",
        "--index-url https://example.org/simple --trusted-host example.org",
        "-ihttps://example.org/simple --pre",
        "pkg @ https://example.org/pkg-1.0-py3-none-any.whl",
        "/srv/wheels/pkg-1.0-py3-none-any.whl",
    ],
)
def test_lines_that_choose_packages_and_sources_are_accepted(line: str) -> None:
    assert check_requirements([line]) == [line]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("-e .", "editable"),
        ("-e.", "editable"),
        ("--editable=/home/alice/project", "editable"),
        ("--target /x", "the daemon chooses where"),
        ("--target=/x", "the daemon chooses where"),
        ("-t/x", "the daemon chooses where"),
        ("--prefix /usr/local", "the daemon chooses where"),
        ("--root /", "the daemon chooses where"),
        ("--user", "the daemon chooses where"),
        ("-r other.txt", "nested requirements file"),
        ("--requirement=/etc/passwd", "nested requirements file"),
        ("-c constraints.txt", "constraints file"),
        ("--pre -r /root/.ssh/id_rsa", "nested requirements file"),
        ("--index-url https://example.org/simple -r /etc/shadow", "nested requirements file"),
        ("--no-index --target=/x", "the daemon chooses where"),
        ("--pre /root/.ssh/id_rsa", "neither an option"),
        ("--global-option=--prefix=/x", "not supported"),
        ("pkg --config-settings=x=y", "not supported"),
        ("pkg --install-option=--prefix=/x", "not supported"),
        ("./project", "relative path"),
        ("../elsewhere", "relative path"),
        ("--index-url https://x/${AWS_SECRET_ACCESS_KEY}/simple", "environment variables"),
        ("numpy \\", "continuation"),
        ("pkg\x00", "NUL"),
        ("x" * 5000, "longer than"),
    ],
)
def test_lines_that_could_escape_are_refused(line: str, why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        check_requirements([line])


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("numpy", "list of strings"),
        (["numpy", 3], "list of strings"),
        (["pkg"] * 501, "at most 500 lines"),
        (["x" * 4000] * 20, "at most 65536 characters"),
    ],
)
def test_requirements_must_be_bounded_text(value: object, why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        check_requirements(value)


def test_blank_lines_and_comments_are_dropped_and_the_spec_keeps_the_lines() -> None:
    spec = PoolSpec.from_json("p", {"requirements": ["# tools", "", "  numpy  ", "--no-index"]})
    assert spec.requirements == ["numpy", "--no-index"]
    with pytest.raises(InvalidRequest, match="pip_config must be true or false"):
        PoolSpec.from_json("p", {"pip_config": "no"})


def test_the_hash_changes_with_the_lines_only() -> None:
    assert requirements_hash(["a"]) == requirements_hash(["a"])
    assert requirements_hash(["a"]) != requirements_hash(["a==1"])


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("https://pypi.org/simple", False),
        ("http://example.invalid/simple", False),
        ("https://user:password@example.org/simple", True),
        ("https://token@example.org/simple", True),
        ("https://__token__:@example.org/simple", True),
        ("https://example.org/simple?token=abc", True),
        ("https://host/s3cr3tT0k3n/simple", True),
        ("https://pypi.fury.io/1a2b3c4d5e6f/alice/", True),
        ("https://example.org/api/pypi/pypi-remote/simple", False),
        ("https://example.org/repository/pypi-proxy/simple/", False),
        ("https://devpi.example.org/root/pypi/+simple/", False),
        ("https://example.org/py3/simple", False),
    ],
)
def test_urls_with_credentials_are_recognized(url: str, secret: bool) -> None:
    assert has_credentials(url) is secret


def test_pip_settings_follow_pips_precedence() -> None:
    items = [
        ("global.index-url", "https://global/simple"),
        ("install.index-url", "https://install/simple"),
        ("global.trusted-host", "global-host"),
        (":env:.trusted-host", "env-host"),
        ("download.index-url", "https://download/simple"),
    ]
    assert effective_settings(items) == {
        "index-url": "https://install/simple",
        "trusted-host": "env-host",
    }


def test_forwarding_drops_credentials_and_says_why(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    settings = {
        "index-url": "https://alice:s3cret@private.example/simple",
        "extra-index-url": "https://public.example/simple https://tok@x.example/simple "
        "https://host.example/s3cr3tT0k3n/simple",
        "trusted-host": "public.example",
        "cert": str(ca),
    }
    result = forwarding(settings, {"SSL_CERT_FILE": "/nonexistent.pem"}, str(tmp_path / "state"))
    assert result.env == {
        "PIP_EXTRA_INDEX_URL": "https://public.example/simple",
        "PIP_TRUSTED_HOST": "public.example",
        "PIP_CERT": str(ca),
    }
    assert result.files == [str(ca)]
    said = " ".join(result.dropped)
    assert "s3cret" not in said and "tok@" not in said and "T0k3n" not in said
    assert "credentials" in said and "SSL_CERT_FILE=/nonexistent.pem" in said


def test_forwarding_never_binds_a_file_of_the_daemons_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "router-secret").write_text("secret")
    result = forwarding({"cert": str(state / "router-secret")}, {}, str(state))
    assert result.files == [] and "PIP_CERT" not in result.env
    assert "state directory" in result.dropped[0]


@pytest.mark.parametrize(
    ("relative", "allowed"),
    [
        ("pools/numeric/0123456789abcdef", True),
        ("pools/numeric", False),  # the pool's directory, with staging areas
        ("pools", False),
        ("", False),  # the state directory itself
        ("workspaces/other-sandbox", False),
        ("pools/numeric/.installing-0123-x", False),
        ("pools/numeric/0123456789abcdef/../../../router-secret", False),
        ("pools/numeric/link-to-state", False),
    ],
)
def test_only_a_pools_package_directory_is_bound(
    tmp_path: Path, relative: str, allowed: bool
) -> None:
    state = tmp_path / "state"
    for sub in ("pools/numeric/0123456789abcdef", "pools/numeric/.installing-0123-x"):
        (state / sub).mkdir(parents=True)
    (state / "workspaces" / "other-sandbox").mkdir(parents=True)
    (state / "router-secret").write_text("secret")
    os.symlink(state, state / "pools" / "numeric" / "link-to-state")
    path = str(state / relative) if relative else str(state)
    if allowed:
        assert check_pool_packages(path, state) == os.path.realpath(path)
    else:
        with pytest.raises(UnsafeMount):
            check_pool_packages(path, state)


def test_the_cli_reads_a_requirements_file_with_find_links_relative_to_it(
    tmp_path: Path,
) -> None:
    from jupyter_sandbox.cli import read_requirements

    (tmp_path / "requirements.txt").write_text("--no-index\n-f wheels\nnumpy==2.1\n")
    assert read_requirements(str(tmp_path / "requirements.txt")) == [
        "--no-index",
        f"-f {tmp_path / 'wheels'}",
        "numpy==2.1",
    ]
    with pytest.raises(InvalidRequest, match="cannot read requirements file"):
        read_requirements(str(tmp_path / "missing.txt"))
