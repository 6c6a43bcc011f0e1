"""Reading a multipart/form-data upload's small fields as its bytes arrive, without holding
its file: the audio routes route by the `model` field, which the openai SDK (httpx) sends
before the file, and must not wait for a many-megabyte upload to end to find it.

The parsing is python-multipart's streaming parser (the one FastAPI and Starlette use);
this module only keeps the values of the fields it is asked for, each bounded in size, and
skips every other part's bytes.
"""

from __future__ import annotations

from python_multipart.multipart import MultipartParser, parse_options_header

from proxy.errors import ProxyError

# A field the proxy reads is a model name or a flag: anything longer is not one.
MAX_FIELD_BYTES = 4096


def form_boundary(content_type: str | None) -> bytes:
    """The boundary of a multipart/form-data body, from its Content-Type; 400 otherwise."""
    kind, options = parse_options_header(content_type or "")
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise ProxyError(
            400,
            "expected a multipart/form-data body (a `file` part and form fields such as "
            "`model`), as the openai SDK sends it",
        )
    return boundary


class FieldPeek:
    """Feed it the body's bytes in order; `values` holds the wanted fields seen so far.
    `done` once every wanted field was seen (what follows need not be parsed)."""

    __slots__ = ("_field", "_header", "_name", "_parser", "_value", "_wanted", "values")

    def __init__(self, boundary: bytes, wanted: frozenset[str]) -> None:
        self._wanted = wanted
        self.values: dict[str, str] = {}
        self._field = b""  # the name of the header being read
        self._header = b""  # its value
        self._name: str | None = None  # the current part's field name, when it is wanted
        self._value = bytearray()
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value,
                "on_header_end": self._header_end,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    @property
    def done(self) -> bool:
        return len(self.values) == len(self._wanted)

    def feed(self, data: bytes) -> None:
        """Parse the next bytes of the body; 400 when they are not multipart."""
        try:
            self._parser.write(data)
        except ValueError as e:  # python-multipart's parse errors are ValueErrors
            raise ProxyError(400, f"the multipart/form-data body is malformed: {e}") from None

    def _part_begin(self) -> None:
        self._name = None
        self._value.clear()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end].lower()

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_end(self) -> None:
        name, value = self._field, self._header
        self._field = self._header = b""
        if name != b"content-disposition":
            return
        _, options = parse_options_header(value)
        field = options.get(b"name", b"").decode("utf-8", "replace")
        if field in self._wanted and b"filename" not in options:
            self._name = field

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name is None:
            return
        self._value += data[start:end]
        if len(self._value) > MAX_FIELD_BYTES:
            message = f"the form field `{self._name}` is over {MAX_FIELD_BYTES} bytes"
            raise ProxyError(400, message, param=self._name)

    def _part_end(self) -> None:
        if self._name is not None:
            self.values[self._name] = self._value.decode("utf-8", "replace")
            self._name = None
