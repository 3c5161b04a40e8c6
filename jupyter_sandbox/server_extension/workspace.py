"""A sandboxed kernel's workspace as Jupyter contents: browse, open, download, upload.

``/api/sandbox/kernels/<id>/contents/<path>`` answers like jupyter_server's
contents API (directory and file models), so JupyterLab's own file browser and
document viewers work on it through a drive; ``.../download/<path>`` streams a
file as an attachment. Every call goes through the router to the sandbox's
runtime, which confines paths to the workspace; paths are also checked here, so
a traversal attempt is a 400 before it leaves the server. The runtime API has no
delete, rename or mkdir, so neither has this.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import mimetypes
import os
import tempfile
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web

from ..control_plane.base import Endpoint
from ..kernel_provisioner import runtime_files
from .handlers import SandboxAPIHandler, http_error

# Opening a file in the browser reads it whole; bigger ones are for the download link.
OPEN_MAX_BYTES = 20 * 1024 * 1024
UPLOAD_MAX_BYTES = 1024 * 1024 * 1024
# A chunked upload (JupyterLab sends big files in 1 MB chunks) left unfinished this
# long is dropped.
CHUNK_TTL_SECONDS = 3600.0


def clean_path(path: str) -> str:
    """A workspace-relative path, or a 400: no '..', no empty or NUL components."""
    parts = [p for p in path.strip("/").split("/") if p]
    for part in parts:
        if part in (".", "..") or "\x00" in part or "\\" in part:
            raise web.HTTPError(400, f"{path!r} is not a path in the workspace")
    return "/".join(parts)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=UTC).isoformat()


def _model(path: str, entry: dict[str, Any]) -> dict[str, Any]:
    kind = "directory" if entry.get("type") == "directory" else "file"
    modified = _iso(float(entry.get("mod_time") or 0))
    return {
        "name": os.path.basename(path) or "",
        "path": path,
        "type": kind,
        "created": modified,
        "last_modified": modified,
        "mimetype": None if kind == "directory" else mimetypes.guess_type(path)[0],
        "format": None,
        "content": None,
        "size": None if kind == "directory" else int(entry.get("size") or 0),
        "writable": True,
    }


class _WorkspaceHandler(SandboxAPIHandler):
    def endpoint(self, kernel_id: str) -> Endpoint:
        session = self.provisioner(kernel_id).session
        if session is None or session.endpoint is None:
            raise web.HTTPError(409, "the kernel's sandbox is not ready yet")
        if session.suspended:
            raise web.HTTPError(
                409, "the sandbox is suspended: run a cell (or Resume Sandbox) to see its files"
            )
        return session.endpoint

    async def entry(self, endpoint: Endpoint, path: str) -> dict[str, Any] | None:
        """The parent directory's entry for ``path`` (None: no such file)."""
        parent, _, name = path.rpartition("/")
        try:
            entries = await runtime_files.list_dir(endpoint, parent)
        except runtime_files.RuntimeFileError as exc:
            if exc.status == 404:
                return None
            raise http_error(exc) from None
        return next((e for e in entries if e.get("name") == name), None)


class ContentsHandler(_WorkspaceHandler):
    # (kernel id, path) -> (temp file, bytes so far, last chunk time)
    _chunks: dict[tuple[str, str], tuple[str, int, float]] = {}

    @web.authenticated
    @authorized
    async def get(self, kernel_id: str, path: str = "") -> None:
        path = clean_path(path)
        endpoint = self.endpoint(kernel_id)
        content = self.get_query_argument("content", "1") not in ("0", "false")
        fmt = self.get_query_argument("format", None)
        if fmt not in (None, "text", "base64"):
            raise web.HTTPError(400, "format must be 'text' or 'base64'")
        try:
            entries = await runtime_files.list_dir(endpoint, path)
        except runtime_files.RuntimeFileError as exc:
            if exc.status != 404:
                raise http_error(exc) from None
        else:
            model = _model(path, {"type": "directory"})
            if content:
                visible = [e for e in entries if not str(e.get("name", ".")).startswith(".")]
                model["content"] = [_model(f"{path}/{e['name']}".lstrip("/"), e) for e in visible]
                model["format"] = "json"
            self.finish(json.dumps(model))
            return
        entry = await self.entry(endpoint, path) if path else None
        if entry is None or entry.get("type") == "directory":
            raise web.HTTPError(404, f"no {path!r} in the sandbox's workspace")
        model = _model(path, entry)
        if content:
            model.update(await self._read(endpoint, path, fmt))
        self.finish(json.dumps(model))

    async def _read(self, endpoint: Endpoint, path: str, fmt: str | None) -> dict[str, Any]:
        buffer = io.BytesIO()
        try:
            await runtime_files.download(endpoint, path, buffer.write, OPEN_MAX_BYTES)
        except runtime_files.RuntimeFileError as exc:
            if exc.status == 413:
                raise web.HTTPError(
                    413, f"{path} is larger than {OPEN_MAX_BYTES >> 20} MB: download it instead"
                ) from None
            raise http_error(exc) from None
        data = buffer.getvalue()
        if fmt != "base64":
            try:
                return {"format": "text", "content": data.decode("utf-8")}
            except UnicodeDecodeError:
                if fmt == "text":
                    raise web.HTTPError(400, f"{path} is not UTF-8 text") from None
        return {
            "format": "base64",
            "content": base64.b64encode(data).decode("ascii"),
            "mimetype": mimetypes.guess_type(path)[0] or "application/octet-stream",
        }

    @web.authenticated
    @authorized
    async def put(self, kernel_id: str, path: str = "") -> None:
        path = clean_path(path)
        if not path:
            raise web.HTTPError(400, "name the file to write")
        endpoint = self.endpoint(kernel_id)
        body = self.get_json_body()
        if not isinstance(body, dict) or body.get("type", "file") != "file":
            raise web.HTTPError(400, "only files can be written to the sandbox's workspace")
        data = _decode(body)
        chunk = body.get("chunk")
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)):
            raise web.HTTPError(400, "chunk must be an integer")
        temp, size = self._collect(kernel_id, path, data, chunk)
        if temp is None:  # more chunks to come
            self.finish(json.dumps(_model(path, {"size": size, "mod_time": time.time()})))
            return
        try:
            part = runtime_files.UploadPart(path, size, lambda: open(temp, "rb"))
            await runtime_files.upload(endpoint, [part])
        except runtime_files.RuntimeFileError as exc:
            raise http_error(exc) from None
        finally:
            os.unlink(temp)
        entry = await self.entry(endpoint, path) or {"size": size, "mod_time": time.time()}
        self.set_status(201)
        self.finish(json.dumps(_model(path, entry)))

    def _collect(
        self, kernel_id: str, path: str, data: bytes, chunk: int | None
    ) -> tuple[str | None, int]:
        """Gather a (chunked) upload in a temp file: (the file when complete, its size)."""
        self._drop_stale_chunks()
        key = (kernel_id, path)
        if chunk is None or chunk == 1:
            self._discard(key)
            fd, temp = tempfile.mkstemp(prefix="jupyter-sandbox-upload-")
            os.close(fd)
            size = 0
        elif key in self._chunks:
            temp, size, _ = self._chunks[key]
        else:
            raise web.HTTPError(400, f"chunk {chunk} of {path} came without chunk 1")
        size += len(data)
        if size > UPLOAD_MAX_BYTES:
            self._discard(key)
            os.unlink(temp)
            raise web.HTTPError(413, f"uploads stop at {UPLOAD_MAX_BYTES >> 20} MB")
        with open(temp, "ab") as handle:
            handle.write(data)
        if chunk is None or chunk == -1:
            self._chunks.pop(key, None)
            return temp, size
        self._chunks[key] = (temp, size, time.monotonic())
        return None, size

    def _discard(self, key: tuple[str, str]) -> None:
        old = self._chunks.pop(key, None)
        if old is not None and os.path.exists(old[0]):
            os.unlink(old[0])

    def _drop_stale_chunks(self) -> None:
        now = time.monotonic()
        for key, (_, _, at) in list(self._chunks.items()):
            if now - at > CHUNK_TTL_SECONDS:
                self._discard(key)


class DownloadHandler(_WorkspaceHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str, path: str) -> None:
        path = clean_path(path)
        endpoint = self.endpoint(kernel_id)
        entry = await self.entry(endpoint, path) if path else None
        if entry is None or entry.get("type") == "directory":
            raise web.HTTPError(404, f"no file {path!r} in the sandbox's workspace")
        self.set_header("Content-Type", "application/octet-stream")
        name = os.path.basename(path).replace('"', "")
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        try:
            await runtime_files.download(
                endpoint, path, self._pass_on, max(int(entry.get("size") or 0), 0) + (1 << 20)
            )
        except runtime_files.RuntimeFileError as exc:
            if self._headers_written:
                raise
            raise http_error(exc) from None
        self.finish()

    def _pass_on(self, chunk: bytes) -> Awaitable[None]:
        """Send a chunk on at once; the download reads on when the browser took it,
        so the server never holds more of a file than a chunk and the socket buffers
        (it held the whole file: 4 GB for a sparse 1.5 GB file)."""
        self.write(chunk)
        return self.flush()


def _decode(body: dict[str, Any]) -> bytes:
    content = body.get("content")
    if not isinstance(content, str):
        raise web.HTTPError(400, "content must be a string")
    fmt = body.get("format", "text")
    if fmt == "text":
        return content.encode("utf-8")
    if fmt == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise web.HTTPError(400, "content is not valid base64") from None
    raise web.HTTPError(400, "format must be 'text' or 'base64'")


def workspace_handlers(base_url: str) -> list[tuple[str, Any]]:
    kernel = url_path_join(base_url, "api/sandbox/kernels/(?P<kernel_id>[^/]+)")
    return [
        (kernel + "/contents/?", ContentsHandler),
        (kernel + "/contents/(?P<path>.+)", ContentsHandler),
        (kernel + "/download/(?P<path>.+)", DownloadHandler),
    ]
