"""Streaming multipart upload: parts are written to disk as they arrive, size bounded."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header
from tornado import web

from .paths import PathInvalid, PathRefused, confine


class UploadError(web.HTTPError):
    pass


class StreamingUpload:
    """Feeds request body chunks through python-multipart into files in the workspace."""

    def __init__(self, workspace: str, content_type: str, limit: int) -> None:
        kind, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise UploadError(400, "expected multipart/form-data with a boundary")
        self.workspace = workspace
        self.limit = limit
        self.received = 0
        self.saved: list[tuple[str, str]] = []  # (temp path, destination)
        self.filenames: list[str] = []
        self.error: UploadError | None = None
        self._field = b""
        self._value = b""
        self._headers: dict[bytes, bytes] = {}
        self._handle: Any = None
        self._target: str | None = None
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value,
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    def feed(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.limit:
            self.discard()
            raise UploadError(413, f"upload larger than {self.limit} bytes")
        try:
            self._parser.write(chunk)
        except Exception as exc:  # python-multipart raises its own parse errors
            self.discard()
            raise UploadError(400, f"malformed multipart body: {exc}") from None
        if self.error is not None:
            self.discard()
            raise self.error

    def _part_begin(self) -> None:
        self._headers = {}
        self._target = None

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field = self._value = b""

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        if params.get(b"name") != b"file":
            return
        filename = params.get(b"filename", b"").decode("utf-8", errors="replace")
        if not filename:
            self.error = UploadError(400, "the uploaded file needs a filename")
            return
        try:
            target = confine(self.workspace, filename)
        except PathInvalid as exc:
            self.error = UploadError(400, str(exc))
            return
        except PathRefused:
            self.error = UploadError(403, "Access denied")
            return
        if os.path.isdir(target):
            self.error = UploadError(400, "a directory has that name")
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".upload-", dir=os.path.dirname(target))
        self._handle = os.fdopen(fd, "wb")
        self._target = target
        self.saved.append((temp, target))
        self.filenames.append(filename)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._handle is not None:
            self._handle.write(data[start:end])

    def _part_end(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def commit(self) -> list[str]:
        """Move every complete file into place (atomic per file)."""
        self._parser.finalize()
        if self._handle is not None:
            self.discard()
            raise UploadError(400, "multipart body ended inside a part")
        if not self.saved:
            raise UploadError(400, "multipart field 'file' is required")
        for temp, target in self.saved:
            os.replace(temp, target)
        return self.filenames

    def discard(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        for temp, _ in self.saved:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
        self.saved = []
