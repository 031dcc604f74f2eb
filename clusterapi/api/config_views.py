"""Configuration versions in the API: ``/api/v1/configs/``.

Reading needs any account; saving and pushing need the operator role. A new
version starts from the current one: either send the complete ``document`` (the
editor's way) or only the top-level ``changes`` to the current document, and
``base`` (the version the edit started from) to be told with a 409 when someone
pushed in between. Saving the current document again changes nothing, saving an
older version's document pushes that version again (``outcome`` says which).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from clusterapi import configs
from clusterapi.api import filters, serializers
from clusterapi.api.schema import errors
from clusterapi.api.views import ApiMixin
from clusterapi.models import ConfigVersion

VERSION_NUMBER = OpenApiParameter(
    "number", OpenApiTypes.INT, OpenApiParameter.PATH, description="version number (1, 2, ...)"
)


def saved_response(saved: configs.Saved, request: Request) -> Response:
    """The version a save or push ended on: 201 when created, else 200."""
    data = serializers.ConfigSavedSerializer(
        saved.version, context={"request": request, "outcome": saved.outcome}
    ).data
    code = status.HTTP_201_CREATED if saved.outcome == configs.CREATED else status.HTTP_200_OK
    return Response(data, status=code)


@extend_schema_view(
    list=extend_schema(
        summary="List configuration versions",
        description="Every saved configuration document, newest first, with `current` marking "
        "the one brokers should run (the one pushed last) and `unset` stating what each "
        "missing key means: the brokers' own setting.",
    ),
    retrieve=extend_schema(
        summary="One configuration version",
        description="A version with, per broker, what it reports running: `running` when "
        "it runs this version, else pending, failed, drifted or down.",
        parameters=[VERSION_NUMBER],
    ),
)
class ConfigVersionViewSet(ApiMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    queryset = ConfigVersion.objects.select_related("created_by")
    filterset_class = filters.ConfigVersionFilter
    lookup_field = "number"
    lookup_value_regex = r"\d+"

    def get_serializer_class(self) -> type:
        if self.action == "list":
            return serializers.ConfigVersionSerializer
        if self.action == "create":
            return serializers.ConfigCreateSerializer
        return serializers.ConfigVersionDetailSerializer

    @extend_schema(
        summary="Save and push a configuration",
        description="Starts from the current version: send the complete `document`, or "
        "`changes` to make to the current document (a key set to null is removed, which "
        "means the brokers' own setting). A new document becomes a new version, pushed to "
        "every broker that is up (201). The current document again changes nothing, and "
        "an older version's document pushes that version again (200; see `outcome`). "
        "With `base`, a 409 says someone pushed another version since you started. A "
        "document that breaks the rules JSON cannot express (a heartbeat timeout not above "
        "its interval, a permission for a user the document lacks ...) is a 422 naming "
        "the key.",
        request=serializers.ConfigCreateSerializer,
        responses={
            201: serializers.ConfigSavedSerializer,
            200: serializers.ConfigSavedSerializer,
            **errors(422),
        },
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = serializers.ConfigCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        document = data["document"] if "document" in data else configs.derive(data["changes"])
        saved = configs.save(document, request.user, data["comment"], base=data.get("base"))
        return saved_response(saved, request)

    @extend_schema(
        operation_id="configs_push",
        summary="Push a version again",
        description="Makes this version the current one and pushes it to every broker that "
        "is up: the way back to an older configuration, or to bring a broker that drifted "
        "(after a reload, say) back to the current one. Operators only; audited.",
        parameters=[VERSION_NUMBER],
        request=serializers.ConfigPushSerializer,
        responses={200: serializers.ConfigSavedSerializer},
    )
    @action(detail=True, methods=["post"], filter_backends=[])
    def push(self, request: Request, number: str | None = None) -> Response:
        version = self.get_object()
        body = serializers.ConfigPushSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return saved_response(
            configs.repush(version, request.user, body.validated_data["comment"]), request
        )

    @extend_schema(
        summary="The current configuration version",
        description="The version brokers should run, with what each reports running; "
        "404 until a version has been saved.",
        responses={200: serializers.ConfigVersionDetailSerializer},
        filters=False,
    )
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def current(self, request: Request) -> Response:
        version = configs.current()
        if version is None:
            raise NotFound("no configuration version has been saved yet")
        return Response(serializers.ConfigVersionDetailSerializer(version).data)
