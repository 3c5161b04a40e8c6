"""The sandbox's workspace as Jupyter contents, through a real Jupyter server and runtime.

What JupyterLab's file browser does with it: list, open text and binary files,
download, upload (whole and in chunks); and what an attacker tries: paths out of
the workspace, from the browser side and through links planted inside.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient

from .helpers import Server, jupyter_server, kernel_socket, start_kernel, suspend_via_api

pytestmark = pytest.mark.usefixtures("warm_daemon")

WRITE_FILES = (
    "import os\n"
    "home = os.path.expanduser('~')\n"
    "os.makedirs(f'{home}/results', exist_ok=True)\n"
    "open(f'{home}/results/table.csv', 'w').write('a,b\\n1,2\\n')\n"
    "open(f'{home}/blob.bin', 'wb').write(bytes(range(256)))\n"
    "open(f'{home}/.hidden', 'w').write('x')\n"
    "os.symlink('/etc/passwd', f'{home}/passwd-link')\n"
    "print(home)\n"
)


async def raw(server: Server, method: str, path: str, body: bytes | None = None) -> Any:
    client = httpclient.AsyncHTTPClient()
    return await client.fetch(
        f"{server.url}{path}",
        method=method,
        headers=server.headers(),
        body=body,
        raise_error=False,
        allow_nonstandard_methods=True,
    )


async def test_browse_open_download_and_upload(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        async with kernel_socket(server) as (kernel_id, ws):
            base = f"/api/sandbox/kernels/{kernel_id}"
            result = await ws.execute(WRITE_FILES)
            assert result.status == "ok", result.reply

            root = await server.request("GET", f"{base}/contents", expect=200)
            assert root["type"] == "directory" and root["format"] == "json"
            names = {item["name"]: item for item in root["content"]}
            assert names["results"]["type"] == "directory"
            assert names["blob.bin"]["size"] == 256
            assert ".hidden" not in names, "hidden entries are not listed"

            table = await server.request("GET", f"{base}/contents/results/table.csv", expect=200)
            assert table["format"] == "text" and table["content"] == "a,b\n1,2\n"
            assert table["mimetype"] == "text/csv" and table["path"] == "results/table.csv"
            blob = await server.request("GET", f"{base}/contents/blob.bin", expect=200)
            assert blob["format"] == "base64"
            assert base64.b64decode(blob["content"]) == bytes(range(256))
            meta = await server.request("GET", f"{base}/contents/blob.bin?content=0", expect=200)
            assert meta["content"] is None and meta["size"] == 256

            download = await raw(server, "GET", f"{base}/download/blob.bin")
            assert download.code == 200 and download.body == bytes(range(256))
            assert 'filename="blob.bin"' in download.headers["Content-Disposition"]

            # Upload: whole, then in chunks as JupyterLab sends big files.
            body = {"type": "file", "format": "text", "content": "uploaded\n"}
            created = await server.request("PUT", f"{base}/contents/in/up.txt", body, expect=201)
            assert created["path"] == "in/up.txt" and created["size"] == 9
            for chunk, part in ((1, b"one-"), (2, b"two-"), (-1, b"end")):
                body = {
                    "type": "file",
                    "format": "base64",
                    "content": base64.b64encode(part).decode(),
                    "chunk": chunk,
                }
                await server.request("PUT", f"{base}/contents/chunked.bin", body)
            seen = await ws.execute(
                "print(open(f'{home}/in/up.txt').read().strip(),"
                " open(f'{home}/chunked.bin').read())"
            )
            assert seen.stdout.split() == ["uploaded", "one-two-end"], seen.stdout
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_paths_out_of_the_workspace_are_refused(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        async with kernel_socket(server) as (kernel_id, ws):
            base = f"/api/sandbox/kernels/{kernel_id}"
            assert (await ws.execute(WRITE_FILES)).status == "ok"
            for path in (
                "contents/../../../etc/passwd",
                "contents/%2e%2e/%2e%2e/etc/passwd",
                "download/..%2f..%2fetc%2fpasswd",
                "contents/a%00b",
            ):
                response = await raw(server, "GET", f"{base}/{path}")
                assert response.code in (400, 404), (path, response.code, response.body)
                assert b"root:" not in (response.body or b"")
            # A link planted inside that points out: the runtime refuses to follow it.
            response = await raw(server, "GET", f"{base}/contents/passwd-link")
            assert response.code in (403, 404), (response.code, response.body)
            assert b"root:" not in (response.body or b"")
            response = await raw(server, "GET", f"{base}/download/passwd-link")
            assert b"root:" not in (response.body or b"")
            # Writing through ".." is refused as well.
            body = json.dumps({"type": "file", "format": "text", "content": "x"}).encode()
            response = await raw(server, "PUT", f"{base}/contents/../escape.txt", body)
            assert response.code == 400, response.code
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_bad_requests_get_clear_errors(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        missing = "/api/sandbox/kernels/00000000-0000-0000-0000-000000000000/contents"
        response = await server.request("GET", missing)
        assert response["message"].startswith("no kernel"), response
        assert (await raw(server, "GET", "/api/sandbox/kernels/nope/contents")).code == 400
        kernel_id = await start_kernel(server)
        base = f"/api/sandbox/kernels/{kernel_id}"
        response = await raw(server, "GET", f"{base}/contents/no-such-file.txt")
        assert response.code == 404, response.code
        response = await raw(server, "GET", f"{base}/contents?format=yaml")
        assert response.code == 400, response.code
        for body, why in (
            ({"type": "directory"}, "only files"),
            ({"type": "file", "format": "base64", "content": "%%%"}, "base64"),
            ({"type": "file", "format": "text", "content": 3}, "string"),
            ({"type": "file", "content": "x", "chunk": 2}, "without chunk 1"),
        ):
            response = await raw(server, "PUT", f"{base}/contents/x.txt", json.dumps(body).encode())
            assert response.code == 400, (body, response.code)
            assert why in json.loads(response.body)["message"], (body, response.body)
        # Suspended: the answer says what to do.
        await suspend_via_api(server, kernel_id)
        response = await raw(server, "GET", f"{base}/contents")
        assert response.code == 409
        assert "suspended" in json.loads(response.body)["message"]
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
