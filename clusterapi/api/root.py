"""``/api/v1/``: the API's front door, and its interactive documentation page.

The root lists every resource with one line on what it is, plus the schema and
the docs page, so a person (or a script) starting at ``/api/v1/`` finds the
rest. It needs no login, like the schema: it names URLs, never data. The docs
page is drf-spectacular's Swagger UI, with its JavaScript and CSS from the
``drf-spectacular-sidecar`` package (``SWAGGER_UI_DIST = "SIDECAR"``), so it
works without reaching a CDN.
"""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusterapi.api import serializers

#: (URL name, what a user finds there), in the order the root lists them
ENDPOINTS = (
    ("api-token", "POST a username and password to get an API token"),
    ("api-cluster", "the cluster's state: root, readiness, quorum, brokers up, alarms"),
    (
        "api-cluster-members",
        "the cluster's members, their version and the servers forgotten; POST "
        ".../forget/ forgets a stopped one for good",
    ),
    ("api-endpoints", "AMQP URLs of the brokers clients can connect to now"),
    ("api-bridges", "bridges (shovels): where each runs, its state, reason and rate"),
    (
        "broker-list",
        "brokers; POST .../{id}/root/ and .../{id}/dump/ send commands, "
        ".../{id}/decommission/ retires one that is gone for good",
    ),
    (
        "queue-list",
        "queues, a shared one once; POST .../{id}/move/ moves one to another primary, "
        ".../rebalance/ spreads them over the primaries, .../grow/ and .../shrink/ take a "
        "primary into or out of the quorum groups",
    ),
    ("exchange-list", "exchanges, per broker"),
    ("binding-list", "bindings, per broker"),
    ("heartbeat-list", "recent heartbeat samples (older ones are in the lake)"),
    ("queue-sample-list", "recent per-queue samples"),
    ("config-list", "configuration versions; POST saves and pushes, .../{n}/push/ re-pushes"),
    ("config-current", "the current configuration and what each broker runs"),
    ("command-list", "commands sent to brokers and their outcome"),
    ("audit-list", "the audit log"),
    ("event-list", "broker events: restarts, planned stops, links lost"),
    ("alarm-list", "alarms; POST .../{id}/acknowledge/ acknowledges one"),
    ("report-list", "traffic report runs; POST runs one"),
)


class ApiRootView(APIView):
    renderer_classes = [JSONRenderer]
    permission_classes = [AllowAny]
    authentication_classes: list[type] = []

    @extend_schema(
        operation_id="api_root",
        summary="The API's endpoints",
        description="Every resource of the API with a line on what it is, and the links to "
        "the OpenAPI schema and this documentation page. No login needed.",
        responses={200: serializers.ApiRootSerializer},
        auth=[],
    )
    def get(self, request: Request) -> Response:
        def url(name: str) -> str:
            return request.build_absolute_uri(reverse(name))

        body = {
            "endpoints": [
                {"name": name.removesuffix("-list"), "url": url(name), "description": text}
                for name, text in ENDPOINTS
            ],
            "schema": url("api-schema"),
            "docs": url("api-docs"),
        }
        return Response(serializers.ApiRootSerializer(body).data)


class ApiDocsView(SpectacularSwaggerView):
    """Swagger UI over ``/api/v1/schema/`` ("try it out" uses the session and its CSRF
    token, or a token entered under Authorize)."""

    url_name = "api-schema"
    title = "Rookery admin API"
