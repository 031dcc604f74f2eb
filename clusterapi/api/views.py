"""Views of the REST admin API (``/api/v1/``).

Reads are plain querysets; the three writes (root enable/disable, state dump,
a new configuration version) call the service functions, which validate,
audit and hand delivery to Celery, and answer 202/201 with what was created.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import generics, mixins, status, viewsets
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import JSONParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusterapi import cluster, commands, configs
from clusterapi.api import filters, serializers
from clusterapi.api.permissions import IsOperatorOrReadOnly
from clusterapi.models import (
    Alarm,
    AuditEntry,
    BindingSnapshot,
    Broker,
    Command,
    ConfigVersion,
    ExchangeSnapshot,
    HeartbeatSample,
    QueueSample,
    QueueSnapshot,
)

ERRORS = {
    400: OpenApiResponse(serializers.ErrorSerializer, description="invalid request"),
    401: OpenApiResponse(serializers.ErrorSerializer, description="not authenticated"),
    403: OpenApiResponse(serializers.ErrorSerializer, description="not allowed"),
    404: OpenApiResponse(serializers.ErrorSerializer, description="no such object"),
}


class Pagination(PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 1000


class ApiMixin:
    """JSON in and out, readers read and operators write (the error shape: settings)."""

    renderer_classes = [JSONRenderer]
    parser_classes = [JSONParser]
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]
    pagination_class = Pagination
    filter_backends = [DjangoFilterBackend]


class ReadOnlyViewSet(ApiMixin, viewsets.ReadOnlyModelViewSet):
    pass


# -- cluster --------------------------------------------------------------------------------


class ClusterView(ApiMixin, APIView):
    @extend_schema(
        operation_id="cluster_state",
        summary="Cluster state: root, readiness, quorum, brokers up, configuration, alarms",
        responses={200: serializers.ClusterStateSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        return Response(serializers.ClusterStateSerializer(cluster.state()).data)


class EndpointsView(ApiMixin, generics.GenericAPIView):
    """Where clients connect: AMQP URLs of the brokers that are up and ready."""

    pagination_class = None
    filter_backends = []
    serializer_class = serializers.EndpointSerializer

    def get_queryset(self) -> QuerySet[Broker]:
        return Broker.objects.filter(state=Broker.STATE_UP, ready=True).exclude(address="")

    @extend_schema(
        operation_id="endpoints_list",
        summary="AMQP URLs of the brokers that are up and ready (default vhost)",
        responses={200: serializers.EndpointSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        rows = [
            {
                "broker": broker.name,
                "broker_type": broker.broker_type,
                "address": broker.address,
                "url": f"amqp://{broker.address}/%2F",
                "is_root": broker.is_root,
            }
            for broker in self.get_queryset()
        ]
        return Response(self.get_serializer(rows, many=True).data)


# -- brokers ----------------------------------------------------------------------------------

BROKER_ID = OpenApiParameter(
    "id",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="the broker's id, or its name (host:port)",
)


@extend_schema_view(
    list=extend_schema(summary="Brokers"),
    retrieve=extend_schema(summary="One broker", parameters=[BROKER_ID]),
)
class BrokerViewSet(ReadOnlyViewSet):
    queryset = Broker.objects.all()
    serializer_class = serializers.BrokerSerializer
    filterset_class = filters.BrokerFilter
    lookup_value_regex = "[^/]+"

    def get_object(self) -> Broker:
        """By id (digits) or by name, so ``/brokers/127.0.0.1:5701/`` works too."""
        key = str(self.kwargs["pk"])
        pk = filters.broker_pk(key)
        lookup = {"pk": pk} if pk is not None else {"name": key}
        broker = get_object_or_404(Broker, **lookup)
        self.check_object_permissions(self.request, broker)
        return broker

    def _issue(self, name: str) -> Response:
        broker = self.get_object()
        command = commands.issue(broker, name, {}, self.request.user)
        body = serializers.CommandSerializer(command).data
        return Response(body, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="brokers_root",
        summary="Enable or disable the broker as root (a root.enable/root.disable command)",
        parameters=[BROKER_ID],
        request=serializers.RootRequestSerializer,
        responses={202: serializers.CommandSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def root(self, request: Request, pk: str | None = None) -> Response:
        body = serializers.RootRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        enabled = body.validated_data["enabled"]
        return self._issue(Command.ROOT_ENABLE if enabled else Command.ROOT_DISABLE)

    @extend_schema(
        operation_id="brokers_dump",
        summary="Ask for the broker's state dump; the text arrives in the command's result.dump",
        parameters=[BROKER_ID],
        request=serializers.DumpRequestSerializer,
        responses={202: serializers.CommandSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def dump(self, request: Request, pk: str | None = None) -> Response:
        return self._issue(Command.STATE_DUMP)


# -- queues, exchanges, bindings (cluster-wide) ----------------------------------------------


class QueueViewSet(ReadOnlyViewSet):
    queryset = QueueSnapshot.objects.select_related("broker")
    serializer_class = serializers.QueueSerializer
    filterset_class = filters.QueueFilter


class ExchangeViewSet(ReadOnlyViewSet):
    queryset = ExchangeSnapshot.objects.select_related("broker")
    serializer_class = serializers.ExchangeSerializer
    filterset_class = filters.ExchangeFilter


class BindingViewSet(ReadOnlyViewSet):
    queryset = BindingSnapshot.objects.select_related("broker")
    serializer_class = serializers.BindingSerializer
    filterset_class = filters.BindingFilter


# -- history ------------------------------------------------------------------------------------


class HeartbeatViewSet(ReadOnlyViewSet):
    queryset = HeartbeatSample.objects.select_related("broker").order_by("-time", "-id")
    serializer_class = serializers.HeartbeatSerializer
    filterset_class = filters.HeartbeatFilter


class QueueSampleViewSet(ReadOnlyViewSet):
    queryset = QueueSample.objects.select_related("broker").order_by("-time", "-id")
    serializer_class = serializers.QueueSampleSerializer
    filterset_class = filters.QueueSampleFilter


# -- configuration --------------------------------------------------------------------------

VERSION_NUMBER = OpenApiParameter(
    "number", OpenApiTypes.INT, OpenApiParameter.PATH, description="version number (1, 2, ...)"
)


@extend_schema_view(
    list=extend_schema(summary="Configuration versions, newest first"),
    retrieve=extend_schema(
        summary="One configuration version with its convergence per broker",
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
        summary="Save a new configuration version and push it to every broker",
        request=serializers.ConfigCreateSerializer,
        responses={201: serializers.ConfigVersionDetailSerializer, **ERRORS},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = serializers.ConfigCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = configs.create_version(
            body.validated_data["document"],
            request.user,
            comment=body.validated_data.get("comment", ""),
        )
        data = serializers.ConfigVersionDetailSerializer(version).data
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="The current configuration version with its convergence per broker",
        responses={200: serializers.ConfigVersionDetailSerializer, **ERRORS},
        filters=False,
    )
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def current(self, request: Request) -> Response:
        version = configs.current()
        if version is None:
            raise NotFound("no configuration version has been saved yet")
        return Response(serializers.ConfigVersionDetailSerializer(version).data)


# -- commands, audit, alarms --------------------------------------------------------------


@extend_schema_view(
    retrieve=extend_schema(
        parameters=[OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)]
    )
)
class CommandViewSet(ReadOnlyViewSet):
    queryset = Command.objects.select_related("broker", "created_by")
    serializer_class = serializers.CommandSerializer
    filterset_class = filters.CommandFilter
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"


class AuditViewSet(ReadOnlyViewSet):
    queryset = AuditEntry.objects.all()
    serializer_class = serializers.AuditEntrySerializer
    filterset_class = filters.AuditFilter


class AlarmViewSet(ReadOnlyViewSet):
    queryset = Alarm.objects.select_related("broker")
    serializer_class = serializers.AlarmSerializer
    filterset_class = filters.AlarmFilter


# -- authentication ---------------------------------------------------------------------------


class TokenView(ObtainAuthToken):
    """``POST /api/v1/auth/token/`` with username and password -> ``{"token": ...}``."""

    renderer_classes = [JSONRenderer]
