"""``/api/v1/bridges/``: each bridge of the current configuration (and any a broker
runs of its own), with the state the broker running it reports (issue 42).
Definitions are changed through ``/api/v1/configs/`` (the ``bridges`` part)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusterapi import bridges
from clusterapi.api.permissions import IsOperatorOrReadOnly


class BridgeSerializer(serializers.Serializer):
    name = serializers.CharField()
    vhost = serializers.CharField()
    broker = serializers.CharField(help_text="the broker running it ('' when none does)")
    state = serializers.CharField(
        help_text="starting, running, blocked, terminated, or 'not running'"
    )
    reason = serializers.CharField(help_text="why it is in that state")
    since_at = serializers.DateTimeField(allow_null=True, help_text="in that state since")
    src_uri = serializers.CharField(help_text="the source it is connected to (no password)")
    dest_uri = serializers.CharField(help_text="the destination (no password)")
    forwarded = serializers.IntegerField(help_text="messages published to the destination")
    acknowledged = serializers.IntegerField(help_text="messages acknowledged at the source")
    requeued = serializers.IntegerField(help_text="messages the destination refused")
    in_flight = serializers.IntegerField(help_text="forwarded, not yet acknowledged")
    backlog = serializers.IntegerField(
        allow_null=True,
        required=False,
        help_text="messages waiting in its source queue, when last asked (null: not known)",
    )
    rate = serializers.FloatField(help_text="messages forwarded per second, lately")
    defined = serializers.BooleanField(help_text="the current configuration defines it")
    definition = serializers.JSONField(
        allow_null=True, help_text="its definition, passwords redacted"
    )


class BridgesView(APIView):
    renderer_classes = [JSONRenderer]
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]

    @extend_schema(
        operation_id="bridges_list",
        summary="Bridges (shovels)",
        description="Each bridge the current configuration defines, with the broker "
        "running it, its state and reason, its counts and rate, as that broker last "
        "reported; passwords in URIs are never shown. Change them with the "
        "configuration's `bridges` part.",
        responses={200: BridgeSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        return Response(BridgeSerializer(bridges.rows(), many=True).data)
