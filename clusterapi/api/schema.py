"""What the OpenAPI schema says beyond what drf-spectacular infers.

Every operation lists the errors it can answer (all in the shape of
:class:`ErrorSerializer`), request bodies allow no property they do not declare
(the API refuses unknown fields, see ``strict.py``), and the schema's own
descriptions are written for the API's users.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """Every error response: a message and DRF's structured detail."""

    error = serializers.CharField(help_text="what went wrong, for a person")
    detail = serializers.JSONField(allow_null=True, help_text="structured detail, e.g. per field")


_WHY = {
    400: "invalid request: a parameter or body field is wrong or unknown (the message names it)",
    401: "not authenticated: send `Authorization: Token <your-token>` or log in",
    403: "not allowed: a read-only account, or a failed CSRF check on a session request",
    404: "no such object (or page)",
    409: "the target cannot do this now: the message says why (nothing was started)",
    415: "the body is not JSON: send 'Content-Type: application/json'",
    422: "the configuration document breaks its rules (docs/protocol.md): the message "
    "names the key",
    429: "too many failed logins: this user or address is locked out for a while",
    503: "no broker that could answer is linked to the console now: the message says why",
    504: "the broker did not answer in time; the command stays open (the message names it)",
}


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error responses for ``extend_schema(responses=...)``."""
    return {code: OpenApiResponse(ErrorSerializer, description=_WHY[code]) for code in codes}


#: a read: filters and pages can be wrong, the object can be missing
READ = errors(400, 401, 403, 404)
#: a write: also the role (403), a JSON body, and a target that cannot do it (409)
WRITE = errors(400, 401, 403, 404, 409, 415)


#: a JSON Schema pattern: any text without a NUL character
NO_NUL = "^[^\\x00]*$"


def strict_request_bodies(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Postprocessing hook: what the API refuses, the schema forbids. Request bodies
    (components ``*Request``) take no property they do not declare, and a text query
    parameter is never empty (``strict.StrictFilterBackend``) and never holds a NUL
    character (Django's forms refuse it, and PostgreSQL could not compare it)."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
            for prop in component.get("properties", {}).values():
                if prop.get("type") == "string" and "format" not in prop and "enum" not in prop:
                    prop.setdefault("pattern", NO_NUL)  # DRF's CharField refuses NUL
    create = result.get("components", {}).get("schemas", {}).get("ConfigCreateRequest")
    if create is not None:  # a whole document, or changes to the current one: not both
        create["oneOf"] = [{"required": ["document"]}, {"required": ["changes"]}]
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query" and schema.get("type") == "string":
                    schema.setdefault("minLength", 1)
                    if "enum" not in schema and "format" not in schema:
                        schema.setdefault("pattern", NO_NUL)
            body = operation.get("requestBody", {})
            refs = [c.get("schema", {}).get("$ref", "") for c in body.get("content", {}).values()]
            if any(ref.endswith("/ConfigCreateRequest") for ref in refs):
                body["required"] = True  # a document or changes, never nothing
    return result


class ApiSchema(AutoSchema):
    """The API's schema generator (``DEFAULT_SCHEMA_CLASS``).

    Every operation gets the error responses its method can give (a read: 400, 401,
    403, 404; a write: also 409 and 415), unless it declares its own. Descriptions
    come from ``extend_schema`` only: drf-spectacular would otherwise show a view's
    (or DRF's base class's) docstring, the same developer text on every operation.
    """

    def get_description(self) -> str:
        return ""

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        codes = READ if self.method in ("GET", "HEAD") else WRITE
        for code, response in codes.items():
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(
                    response, str(code), direction=direction
                )
        return responses
