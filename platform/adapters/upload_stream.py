"""The adapter upload's multipart body, streamed straight into a staging folder with a byte cap.

Starlette's form parser (what ``UploadFile`` uses) spools every file to an anonymous file in the
system temp folder whatever its size, and FastAPI runs it before any dependency, so before the
key was checked. Here the body is read only by the route, after authentication (``auth/gate.py``),
the file part goes to ``<store>/.staging/<tmp>/upload`` chunk by chunk (written off the event loop)
and stops at ``max_file_bytes`` (413); the small text fields are held in memory under tight caps.
The caller owns the folder (``AdapterStore.staging``): it is removed whatever happens, and
``housekeeping`` sweeps what a killed process left."""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import anyio.to_thread
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from loraplex.platform.errors import BadRequest, PayloadTooLarge, PlatformError

if TYPE_CHECKING:  # a TypedDict python-multipart declares for type checkers only
    from python_multipart.multipart import MultipartCallbacks

MAX_FIELDS = 16  # parts that are not the file
MAX_FIELD_BYTES = 4096  # one text field's value
FILE_FIELD = "file"


@dataclass
class StagedUpload:
    fields: dict[str, str] = field(default_factory=dict)
    file: Path | None = None  # the staged file part, when the form had one
    filename: str | None = None


class _Form:
    """python-multipart's callbacks: text fields into memory, file data into a queue the async
    loop writes out (the callbacks are synchronous; disk writes must not block the event loop)."""

    def __init__(self, target: Path, max_file_bytes: int, charset: str) -> None:
        self.target = target
        self.max_file_bytes = max_file_bytes
        self.charset = charset
        self.out = StagedUpload()
        self.pending: list[bytes] = []  # file bytes parsed but not yet written
        self._file_bytes = 0
        self._in_file = False
        self._name = ""
        self._value = bytearray()
        self._header_name = b""
        self._header_value = b""
        self._disposition = b""
        self._fields = 0
        self.complete = False  # the closing boundary was seen (python-multipart does not check)

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.on_part_begin,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_end": self.on_end,
        }

    def on_end(self) -> None:
        self.complete = True

    def on_part_begin(self) -> None:
        self._in_file, self._value, self._disposition = False, bytearray(), b""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]
        if len(self._header_name) > MAX_FIELD_BYTES:
            raise BadRequest("a multipart part header is too long", code="invalid_body")

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]
        if len(self._header_value) > MAX_FIELD_BYTES:
            raise BadRequest("a multipart part header is too long", code="invalid_body")

    def on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_name, self._header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise BadRequest('a multipart part has no Content-Disposition "name"', code="invalid_body")
        self._name = options[b"name"].decode(self.charset, "replace")
        if self._name == FILE_FIELD:
            if self.out.file is not None:
                raise BadRequest("the form has more than one 'file'", param=FILE_FIELD, code="invalid_body")
            self._in_file = True
            self.out.file = self.target
            self.out.filename = options.get(b"filename", b"").decode(self.charset, "replace")
            return
        self._fields += 1
        if self._fields > MAX_FIELDS:
            raise BadRequest(f"the form has more than {MAX_FIELDS} fields", code="invalid_body")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._in_file:
            self._file_bytes += len(chunk)
            if self._file_bytes > self.max_file_bytes:
                raise PayloadTooLarge(f"the upload is larger than {self.max_file_bytes} bytes", param=FILE_FIELD)
            self.pending.append(chunk)
            return
        self._value += chunk
        if len(self._value) > MAX_FIELD_BYTES:
            raise BadRequest(f"the form field {self._name!r} is too long", param=self._name, code="invalid_body")

    def on_part_end(self) -> None:
        if not self._in_file:
            self.out.fields.setdefault(self._name, self._value.decode(self.charset, "replace"))


async def stage_multipart(
    content_type: str, stream: AsyncIterator[bytes], folder: Path, *, max_file_bytes: int
) -> StagedUpload:
    """Parse ``stream`` (the request body) as multipart/form-data; the ``file`` part lands in
    ``folder / "upload"`` (always created, empty when the form had no file)."""
    ctype, params = parse_options_header(content_type)
    if ctype != b"multipart/form-data":
        return StagedUpload()  # no file in it (a urlencoded form, no body): the caller says so
    if not params.get(b"boundary"):
        raise BadRequest("a multipart/form-data body needs a boundary", code="invalid_body")
    charset = params.get(b"charset", b"utf-8").decode("latin-1")
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "latin-1"
    form = _Form(folder / "upload", max_file_bytes, charset)
    parser = MultipartParser(params[b"boundary"], form.callbacks())
    with open(form.target, "wb") as out:
        async for chunk in stream:
            try:
                _feed(parser, chunk)
            except PlatformError as exc:  # refused mid-body: the rest of it is never read
                exc.headers.setdefault("connection", "close")
                raise
            await _flush(form, out)
    if not form.complete:
        raise BadRequest("the multipart body ended before its closing boundary", code="invalid_body")
    return form.out


def _feed(parser: MultipartParser, chunk: bytes) -> None:
    try:
        parser.write(chunk)
    except FormParserError:
        raise BadRequest("the multipart body is malformed", code="invalid_body") from None


async def _flush(form: _Form, out: IO[bytes]) -> None:
    if form.pending:
        data, form.pending = b"".join(form.pending), []
        await anyio.to_thread.run_sync(out.write, data)
