"""Views of the REST admin API (``/api/v1/``).

Reads are plain querysets; the writes (root enable/disable, state dump, a
configuration version or a push of one, an alarm's acknowledgement) call the
service functions, which validate, audit and hand delivery to Celery, and answer
with what was created. What a user reads about each operation in the schema and
the docs page is written in ``extend_schema`` (summary and description), not in
these classes' docstrings, which are for developers.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, status, viewsets
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusterapi import alarms, cluster, commands, decommission, objects, owners
from clusterapi.api import filters, object_serializers, serializers
from clusterapi.api.parsers import SafeJSONParser
from clusterapi.api.permissions import IsOperatorOrReadOnly
from clusterapi.api.schema import errors
from clusterapi.api.strict import StrictFilterBackend, StrictPagination, StrictSerializer
from clusterapi.models import (
    Alarm,
    AuditEntry,
    Broker,
    BrokerEvent,
    Command,
    HeartbeatSample,
    QueueSample,
    QueueSnapshot,
)
from console.views import locked_out


# JSON in and out, readers read and operators write, strict pages and filters.
# (Comments, not docstrings, on these bases: drf-spectacular would show a docstring as
# the description of every operation of every subclass.)
class ApiMixin:
    renderer_classes = [JSONRenderer]
    parser_classes = [SafeJSONParser]
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]
    pagination_class = StrictPagination
    filter_backends = [StrictFilterBackend]


class ReadOnlyViewSet(ApiMixin, viewsets.ReadOnlyModelViewSet):
    # ids are integers: anything else is an unknown URL (a JSON 404), never a lookup
    lookup_value_regex = r"[0-9]+"


def reads(noun: str, what: str, item: str, one: str, **extra: Any) -> Any:
    """``extend_schema_view`` of a read-only resource: its list and one item, for users."""
    return extend_schema_view(
        list=extend_schema(
            summary=f"List {noun}",
            description=f"{what} Paginated: `page` and `page_size` (1 to 1000). The filters "
            "narrow the list; a filter value that cannot be read is refused with a 400.",
        ),
        retrieve=extend_schema(summary=f"One {item}", description=one, **extra),
    )


# -- cluster --------------------------------------------------------------------------------


class ClusterView(ApiMixin, APIView):
    @extend_schema(
        operation_id="cluster_state",
        summary="Cluster state",
        description="The root every broker agrees on, whether the cluster is ready for "
        "clients, the quorum, how many brokers are up, the current configuration version, "
        "how many alarms are active (and not yet acknowledged), and how many queues, "
        "exchanges and bindings the cluster has, each shared one counted once.",
        responses={200: serializers.ClusterStateSerializer},
    )
    def get(self, request: Request) -> Response:
        state = {
            **cluster.state(),
            **objects.counts(),
            "messages_ready": objects.messages_ready(Broker.objects.all()),
        }
        return Response(serializers.ClusterStateSerializer(state).data)


class EndpointsView(ApiMixin, generics.GenericAPIView):
    pagination_class = None
    filter_backends = []
    serializer_class = serializers.EndpointSerializer

    def get_queryset(self) -> QuerySet[Broker]:
        return Broker.objects.filter(state=Broker.STATE_UP, ready=True).exclude(address="")

    @extend_schema(
        operation_id="endpoints_list",
        summary="Where clients connect",
        description="AMQP URLs (default vhost) of the brokers that are up and ready now; "
        "point clients at any of them.",
        responses={200: serializers.EndpointSerializer(many=True)},
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


@reads(
    "brokers",
    "Every broker the console has heard from but the retired ones (`state=retired` lists "
    "those): type, state (up, down, unknown), root flags, "
    "readiness, heartbeat age, the configuration it reports running, counts and rates.",
    "broker",
    "One broker by id or name, with its last status (cluster view, counts, rates).",
    parameters=[BROKER_ID],
)
class BrokerViewSet(ReadOnlyViewSet):
    queryset = objects.brokers()
    serializer_class = serializers.BrokerSerializer
    filterset_class = filters.BrokerFilter
    lookup_value_regex = "[^/]+"

    def get_queryset(self) -> QuerySet[Broker]:
        """The list leaves retired brokers out (``state=retired`` lists them); one broker
        by id or name is found retired or not, as history."""
        wanted = self.request.query_params.get("state") == Broker.STATE_RETIRED
        return objects.brokers(retired=self.action != "list" or wanted)

    def get_object(self) -> Broker:
        """By id (digits) or by name, so ``/brokers/127.0.0.1:5701/`` works too."""
        key = str(self.kwargs["pk"])
        pk = filters.broker_pk(key)
        lookup = {"pk": pk} if pk is not None else {"name": key}
        broker = get_object_or_404(self.get_queryset(), **lookup)
        self.check_object_permissions(self.request, broker)
        return broker

    def _issue(self, name: str) -> Response:
        broker = self.get_object()
        command = commands.issue(broker, name, {}, self.request.user)
        body = serializers.CommandSerializer(command).data
        return Response(body, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="brokers_root",
        summary="Enable or disable a broker as root",
        description="Sends `root.enable` or `root.disable` to a primary (operators only). "
        "Disabling the current root hands the root role to another primary for the whole "
        "cluster. Answers 202 with the command; its state shows whether the broker did it. "
        "409 when the broker cannot: a secondary or standalone broker, a broker that is "
        "down, or root already in that state.",
        parameters=[BROKER_ID],
        request=serializers.RootRequestSerializer,
        responses={202: serializers.CommandSerializer},
    )
    @action(detail=True, methods=["post"])
    def root(self, request: Request, pk: str | None = None) -> Response:
        body = serializers.RootRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        enabled = body.validated_data["enabled"]
        return self._issue(Command.ROOT_ENABLE if enabled else Command.ROOT_DISABLE)

    @extend_schema(
        operation_id="brokers_dump",
        summary="Ask a broker for its state dump",
        description="Sends `state.dump` (operators only) and answers 202 with the command; "
        "once the broker acknowledges it, the dump text is in the command's `result.dump` "
        "(GET /api/v1/commands/{id}/). 409 when the broker is down.",
        parameters=[BROKER_ID],
        request=serializers.DumpRequestSerializer,
        responses={202: serializers.CommandSerializer},
    )
    @action(detail=True, methods=["post"])
    def dump(self, request: Request, pk: str | None = None) -> Response:
        StrictSerializer(data=request.data).is_valid(raise_exception=True)
        return self._issue(Command.STATE_DUMP)

    @extend_schema(
        operation_id="brokers_decommission",
        summary="Retire a broker that is gone for good",
        description="Operators only; audited. `confirm` must be the broker's name. The "
        "broker leaves the lists and counts (`GET /brokers/?state=retired` lists it), its "
        "alarms close, and it is kept, retired, with its history. The cluster file stays the "
        "authority on membership: `next` says what to edit on the servers (remove its "
        "host:port from `known_hosts` in the cluster file on every server, then restart "
        "them one at a time). A broker that links again under that name is active again. "
        "409 when it cannot be retired now: it is up and linked (stop it first), or "
        "retired already; 400 for a wrong confirmation.",
        parameters=[BROKER_ID],
        request=serializers.DecommissionRequestSerializer,
        responses={200: serializers.DecommissionSerializer},
    )
    @action(detail=True, methods=["post"])
    def decommission(self, request: Request, pk: str | None = None) -> Response:
        body = serializers.DecommissionRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        outcome = decommission.retire(
            self.get_object(), request.user, body.validated_data["confirm"]
        )
        return Response(serializers.DecommissionSerializer(outcome).data)


# -- queues, exchanges, bindings (cluster-wide) ----------------------------------------------


# Lists show each shared object once (``clusterapi.objects``); a detail can be read by the id
# of any broker's row, and says what every broker that has the object reports.
class ClusterObjectViewSet(ReadOnlyViewSet):
    detail_queryset: Any = None
    detail_serializer_class: Any = None

    def get_queryset(self) -> QuerySet:
        if self.action == "retrieve":
            return self.detail_queryset.all()
        return super().get_queryset()

    def get_serializer_class(self) -> Any:
        if self.action == "retrieve":
            return self.detail_serializer_class
        return super().get_serializer_class()


@reads(
    "queues",
    "One item per queue of the cluster: a shared queue (declared with exclusive=0 in the "
    "cluster vhost) once, from the broker holding its messages (its master, the root), with "
    "its real depth, its consumers and the brokers they are connected to "
    "(`consumer_servers`); a private queue once per broker that has it. `broker` filters "
    "on the broker holding the messages; `consumers_on` finds the queues a broker has "
    "consumers on.",
    "queue",
    "One queue row by id (the list's, or any broker's row of the queue, e.g. a proxy), with "
    "`per_broker`: what every broker that has the queue reports (a shared queue's master "
    "and its proxies).",
)
class QueueViewSet(ClusterObjectViewSet):
    queryset = objects.queues()
    detail_queryset = QueueSnapshot.objects.select_related("broker")
    serializer_class = object_serializers.QueueSerializer
    detail_serializer_class = object_serializers.QueueDetailSerializer
    filterset_class = filters.QueueFilter

    def get_queryset(self) -> QuerySet:
        # a move may name the queue by any broker's row of it, as a detail does
        if self.action == "move":
            return self.detail_queryset.all()
        return super().get_queryset()

    @extend_schema(
        operation_id="queues_move",
        summary="Move a shared queue to another primary",
        description="Sends `queue.move` (operators only; audited) to a primary linked to the "
        "console, the root first: the queue's owner hands it to the primary `to` (its name "
        "or spid), which holds its messages from then on. Answers 202 with the command; once "
        "acked, its `result` says from which primary to which (`state` `requested`). The "
        "hand-over completes within about a second: the queue's `broker` shows the new owner "
        "when the brokers report it. The queue is given by the id of any broker's row of it. "
        "409 when it cannot move: a private or classic queue (a classic queue has no copy to "
        "hand over), `to` not a primary of the cluster that is up, `to` already the owner, "
        "no primary linked to the console; the broker may still refuse (the command fails, "
        "with its reason) what changed since it last reported, e.g. a move already under way.",
        request=serializers.QueueMoveSerializer,
        responses={202: serializers.CommandSerializer},
    )
    @action(detail=True, methods=["post"], filter_backends=[], pagination_class=None)
    def move(self, request: Request, pk: str | None = None) -> Response:
        queue = self.get_object()
        body = serializers.QueueMoveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        command = owners.move(queue, body.validated_data["to"], request.user)
        return Response(serializers.CommandSerializer(command).data, status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="queues_rebalance",
        summary="Spread the shared queues' owners over the primaries",
        description="Sends `queues.rebalance` (operators only; audited) to a primary linked "
        "to the console, the root first, as `rabbitmq-queues rebalance` does: the root moves "
        "quorum and replicated queues of `vhost` from the primaries that own the most to "
        "those that own the fewest. Answers 202 with the command; once acked, its "
        "`result.moves` lists the moves ordered (`queue`, `from`, `to`; empty: already "
        "even). Classic queues stay where they are. 409 when no primary is linked to the "
        "console.",
        request=serializers.RebalanceSerializer,
        responses={202: serializers.CommandSerializer},
    )
    @action(detail=False, methods=["post"], filter_backends=[], pagination_class=None)
    def rebalance(self, request: Request) -> Response:
        body = serializers.RebalanceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        command = owners.rebalance(body.validated_data["vhost"], request.user)
        return Response(serializers.CommandSerializer(command).data, status.HTTP_202_ACCEPTED)


@reads(
    "exchanges",
    "One item per exchange of the cluster: a shared one (every exchange of the cluster "
    "vhost, replicated to every server) once, with how many brokers have it (`servers`); "
    "others once per broker. `broker` lists what that broker has, shared ones included.",
    "exchange",
    "One exchange row by id (the list's or any broker's copy), with `per_broker`: every "
    "broker that has it.",
)
class ExchangeViewSet(ClusterObjectViewSet):
    queryset = objects.exchanges()
    detail_queryset = objects.exchange_rows()
    serializer_class = object_serializers.ExchangeSerializer
    detail_serializer_class = object_serializers.ExchangeDetailSerializer
    filterset_class = filters.ExchangeFilter


@reads(
    "bindings",
    "One item per binding of the cluster: a shared one (to a shared queue or an exchange "
    "of the cluster vhost, on every server) once, with how many brokers have it "
    "(`servers`); a private queue's bindings on that queue's broker. `broker` lists what "
    "that broker has, shared ones included.",
    "binding",
    "One binding row by id (the list's or any broker's copy), with `per_broker`: every "
    "broker that has it.",
)
class BindingViewSet(ClusterObjectViewSet):
    queryset = objects.bindings()
    detail_queryset = objects.binding_rows()
    serializer_class = object_serializers.BindingSerializer
    detail_serializer_class = object_serializers.BindingDetailSerializer
    filterset_class = filters.BindingFilter


# -- history ------------------------------------------------------------------------------------


@reads(
    "heartbeat samples",
    "One sample per broker status still in the console's database, newest first "
    "(older ones are archived to the lake): counts, totals, rates, root and readiness.",
    "heartbeat sample",
    "One heartbeat sample.",
)
class HeartbeatViewSet(ReadOnlyViewSet):
    queryset = HeartbeatSample.objects.select_related("broker").order_by("-time", "-id")
    serializer_class = serializers.HeartbeatSerializer
    filterset_class = filters.HeartbeatFilter


@reads(
    "queue samples",
    "Per-queue samples still in the console's database, newest first: depth, consumers, "
    "counters and rates in and out.",
    "queue sample",
    "One queue sample.",
)
class QueueSampleViewSet(ReadOnlyViewSet):
    queryset = QueueSample.objects.select_related("broker").order_by("-time", "-id")
    serializer_class = serializers.QueueSampleSerializer
    filterset_class = filters.QueueSampleFilter


# -- commands, audit, alarms --------------------------------------------------------------


@reads(
    "commands",
    "Commands sent to brokers, newest first: pending, sent, acked, failed, timed out, or "
    "superseded (a configuration push replaced by a later one before the broker acked it).",
    "command",
    "One command with its result (e.g. the dump text) or error.",
    parameters=[OpenApiParameter("id", OpenApiTypes.UUID, OpenApiParameter.PATH)],
)
class CommandViewSet(ReadOnlyViewSet):
    queryset = Command.objects.select_related("broker", "created_by")
    serializer_class = serializers.CommandSerializer
    filterset_class = filters.CommandFilter
    lookup_value_regex = "[0-9a-fA-F-]{32,36}"


@reads(
    "audit entries",
    "Who did what and when, newest first: commands, configuration pushes, alarm "
    "acknowledgements, brokers going down and up, reports.",
    "audit entry",
    "One audit entry.",
)
class AuditViewSet(ReadOnlyViewSet):
    queryset = AuditEntry.objects.all()
    serializer_class = serializers.AuditEntrySerializer
    filterset_class = filters.AuditFilter


@reads(
    "broker events",
    "What happened to brokers, newest first: restarts (`details`: old and new spid, the "
    "downtime in seconds when known, whether a planned stop came before), planned stops "
    "(`info`) and links lost without one (`warning`: the broker was marked down at once).",
    "broker event",
    "One broker event.",
)
class EventViewSet(ReadOnlyViewSet):
    queryset = BrokerEvent.objects.select_related("broker")
    serializer_class = serializers.BrokerEventSerializer
    filterset_class = filters.EventFilter


@reads(
    "alarms",
    "Alarms, newest first: active ones (the condition holds) and cleared ones (history), "
    "with who acknowledged them.",
    "alarm",
    "One alarm.",
)
class AlarmViewSet(ReadOnlyViewSet):
    queryset = Alarm.objects.select_related("broker")
    serializer_class = serializers.AlarmSerializer
    filterset_class = filters.AlarmFilter

    @extend_schema(
        operation_id="alarms_acknowledge",
        summary="Acknowledge an alarm",
        description="Records that you have seen an active alarm, with an optional note "
        "(operators only; audited). It stays active until its condition clears, but no "
        "longer counts as unacknowledged. 409 when the alarm is cleared or was "
        "acknowledged already.",
        request=serializers.AlarmAckSerializer,
        responses={200: serializers.AlarmSerializer},
    )
    @action(detail=True, methods=["post"], filter_backends=[])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        alarm = self.get_object()
        body = serializers.AlarmAckSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        alarm = alarms.acknowledge(alarm, request.user, body.validated_data["comment"])
        cluster.notify_dashboard("alarm", alarm.broker.name if alarm.broker_id else None)
        return Response(serializers.AlarmSerializer(alarm).data)


# -- authentication ---------------------------------------------------------------------------


@extend_schema_view(
    post=extend_schema(
        summary="Get an API token",
        description="Exchanges a username and password for the user's API token; send it "
        "as `Authorization: Token <your-token>`. Changing the password revokes the token. "
        "Repeated failed logins lock the user and address out for a while (429).",
        request=serializers.TokenRequestSerializer,
        responses={200: serializers.TokenSerializer, **errors(400, 401, 415, 429)},
        auth=[],
    )
)
class TokenView(ObtainAuthToken):
    """``POST /api/v1/auth/token/`` with username and password -> ``{"token": ...}``."""

    renderer_classes = [JSONRenderer]
    # DRF's three, with its JSON parser replaced: this endpoint takes anonymous bodies
    parser_classes = [FormParser, MultiPartParser, SafeJSONParser]
    serializer_class = serializers.TokenRequestSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        """Wrong credentials are a 401 (DRF says 400): the request was well formed. A
        user and address locked out by django-axes get its 429: axes marks the request
        it was handed, which here is DRF's wrapper, not the one its middleware sees."""
        try:
            return super().post(request, *args, **kwargs)
        except ValidationError as exc:
            if getattr(request, "axes_locked_out", False):
                return locked_out(request._request)
            codes = exc.get_codes()
            if isinstance(codes, dict) and codes.get("non_field_errors") == ["authorization"]:
                raise AuthenticationFailed(exc.detail["non_field_errors"][0]) from None
            raise
