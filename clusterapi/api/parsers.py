"""The API's JSON parser: every refusal of client JSON is a 400, never a 500.

DRF's ``JSONParser`` turns ValueError into a 400 but lets RecursionError through
(a 500), decodes with whatever charset the request names, reads ``1e999`` as an
infinity that no response can carry, and tells a client with a 5,000-digit
integer to call ``sys.set_int_max_str_digits()``. This one reads UTF-8 only and
parses with :func:`console.jsonlimits.load_json`, the same depth and number
rules as the dashboard; the depth was already checked at the door
(``console.bodylimits.BodyLimitsMiddleware``), and is checked again here for
requests that never passed it (a view called directly).
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser

from console.jsonlimits import load_json


class SafeJSONParser(JSONParser):
    """``application/json`` in UTF-8, through :func:`console.jsonlimits.load_json`."""

    def parse(
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding") or "utf-8"
        try:
            utf8 = codecs.lookup(encoding).name == "utf-8"
        except LookupError:
            utf8 = False
        if not utf8:
            raise UnsupportedMediaType(media_type or self.media_type, "JSON must be UTF-8.")
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - not valid UTF-8 (byte {exc.start})") from None
        try:
            return load_json(text)
        except ValueError as exc:  # JsonRefused or a syntax error
            raise ParseError(f"JSON parse error - {exc}") from None
