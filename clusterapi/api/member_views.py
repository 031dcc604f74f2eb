"""``/api/v1/cluster/members/``: the cluster's members as the root reports them, and
``.../forget/``: the root forgets a stopped member, as ``brokerd ctl cluster
members|forget`` do on a server (issue 43; ``clusterapi.members``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusterapi import commands, members
from clusterapi.api.parsers import SafeJSONParser
from clusterapi.api.permissions import IsOperatorOrReadOnly
from clusterapi.api.schema import errors
from clusterapi.api.strict import StrictCharField, StrictSerializer


class MemberSerializer(serializers.Serializer):
    address = serializers.CharField(help_text="host:port the cluster knows it by")
    spid = serializers.CharField(
        allow_null=True, help_text="the run that answers there (null: never heard)"
    )
    type = serializers.CharField(help_text="primary or secondary")
    state = serializers.CharField(
        help_text="self (the reporting broker), up, down (silent past the heartbeat "
        "timeout), gone (its connections closed and its port refuses), never heard; "
        "unknown: a state this console does not know"
    )
    root = serializers.BooleanField(help_text="it is the root")
    forgettable = serializers.BooleanField(
        help_text="not running (down, gone, never heard): the root may forget it"
    )


class ForgottenSerializer(serializers.Serializer):
    address = serializers.CharField()
    node = serializers.CharField(
        allow_blank=True, help_text="its data directory's node ('' when never known)"
    )


class MembersSerializer(serializers.Serializer):
    source = serializers.CharField(help_text="the broker whose status this is (the root first)")
    reported_at = serializers.DateTimeField(help_text="when that broker last reported")
    version = serializers.IntegerField(help_text="the members' version (0: the cluster file's)")
    term = serializers.IntegerField(help_text="the root term that ordered it")
    committed = serializers.BooleanField(help_text="a majority of the members holds this version")
    joining = serializers.BooleanField(help_text="the reporting broker is still joining")
    node = serializers.CharField(allow_blank=True, help_text="the reporting broker's node")
    checksum = serializers.CharField(allow_blank=True, help_text="what every server compares")
    root = serializers.CharField(allow_null=True, help_text="the root's spid (null: none)")
    members = MemberSerializer(many=True, help_text="the primaries, then secondaries heard")
    forgotten = ForgottenSerializer(many=True, help_text="servers the cluster forgot for good")


class ForgetRequestSerializer(StrictSerializer):
    address = StrictCharField(
        max_length=commands.NAME_MAX,
        help_text="the member to forget, as the members list it: HOST:PORT",
    )

    def validate_address(self, value: str) -> str:
        try:
            return commands.member_address(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class ForgetResultSerializer(serializers.Serializer):
    command = serializers.UUIDField(help_text="the cluster.forget command (/api/v1/commands/)")
    broker = serializers.CharField(help_text="the broker that asked the root")
    forgotten = serializers.CharField(help_text="the address forgotten")
    version = serializers.IntegerField(help_text="the members' version now")
    committed = serializers.BooleanField(
        help_text="a majority of the remaining members held it when the broker answered "
        "(false: not within 15 s; GET the members to see it commit)"
    )
    members = serializers.ListField(
        child=serializers.CharField(), help_text="the addresses of the members left"
    )


class MembersView(APIView):
    renderer_classes = [JSONRenderer]
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]

    @extend_schema(
        operation_id="cluster_members",
        summary="The cluster's members",
        description="The members as the root reports them in its status (or, when no root "
        "is linked to the console, the broker heard from last), as `brokerd ctl cluster "
        "members --json` lists them: their version and whether a majority holds it, each "
        "member's address, type, state, run (spid) and the root, and the servers the "
        "cluster forgot. 503 when no broker of a cluster is linked to the console, or none "
        "reports its members.",
        responses={200: MembersSerializer, **errors(401, 403, 503)},
    )
    def get(self, request: Request) -> Response:
        return Response(MembersSerializer(members.table()).data)


class ForgetView(APIView):
    renderer_classes = [JSONRenderer]
    parser_classes = [SafeJSONParser]
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]

    @extend_schema(
        operation_id="cluster_members_forget",
        summary="Forget a stopped member for good",
        description="Sends `cluster.forget` (operators only; audited) to a broker linked to "
        "the console, the root first, as `brokerd ctl cluster forget HOST:PORT` on a "
        "server, and waits for its answer (up to 40 s): the root removes the member and "
        "remembers its node, so the server is refused if it returns with its old disk. "
        "Stop the server first. 200 with the broker's result once a majority of the "
        "remaining members holds the new set (or `committed` false when that took longer "
        "than 15 s). 400 for a malformed address; 409 with the root's reason when it "
        "refuses (a member it still hears: stop it first; itself; not a member; another "
        "change under way: try again shortly); 503 when no broker of a cluster is linked; "
        "504 when the broker did not answer in time (the command stays open).",
        request=ForgetRequestSerializer,
        responses={
            200: ForgetResultSerializer,
            **errors(400, 401, 403, 409, 415, 503, 504),
        },
    )
    def post(self, request: Request) -> Response:
        body = ForgetRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        command = members.forget_and_wait(body.validated_data["address"], request.user)
        result: dict[str, Any] = command.result if isinstance(command.result, dict) else {}
        left = result.get("members")
        return Response(
            ForgetResultSerializer(
                {
                    "command": command.id,
                    "broker": command.broker.name,
                    "forgotten": members.text(result.get("forgotten")) or command.args["address"],
                    "version": members.count(result.get("version")) or 0,
                    "committed": result.get("committed") is True,
                    "members": [members.text(m) for m in left if isinstance(m, str)]
                    if isinstance(left, list)
                    else [],
                }
            ).data
        )
