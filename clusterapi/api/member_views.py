"""``/api/v1/cluster/members/``: the cluster's members as the root reports them,
``.../forget/``: the root forgets a stopped member, as ``brokerd ctl cluster
members|forget`` do on a server, and ``/api/v1/queues/grow|shrink/``: a primary joins
or leaves the quorum groups, as ``brokerd ctl queues grow|shrink`` (issue 43;
``clusterapi.members``, ``clusterapi.groups``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clusterapi import commands, groups, members
from clusterapi.api.parsers import SafeJSONParser
from clusterapi.api.permissions import IsOperatorOrReadOnly
from clusterapi.api.schema import errors
from clusterapi.api.strict import StrictCharField, StrictSerializer
from clusterapi.models import Command


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


class MemberRequestSerializer(StrictSerializer):
    """A request naming one member: its address, checked as the console checks it."""

    def validate_address(self, value: str) -> str:
        try:
            return commands.member_address(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class ForgetRequestSerializer(MemberRequestSerializer):
    address = StrictCharField(
        max_length=commands.NAME_MAX,
        help_text="the member to forget, as the members list it: HOST:PORT",
    )


class GroupChangeRequestSerializer(MemberRequestSerializer):
    address = StrictCharField(
        max_length=commands.NAME_MAX,
        help_text="the running primary to take into or out of the quorum groups, as the "
        "members list it: HOST:PORT",
    )


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


class GroupQueueSerializer(serializers.Serializer):
    queue = serializers.CharField(help_text="a quorum queue of the cluster vhost")
    changed = serializers.BooleanField(help_text="the root changed its group")
    group = serializers.ListField(
        child=serializers.CharField(),
        help_text="its group as the broker knows it when it answered: the members that keep "
        "the queue",
    )
    reason = serializers.CharField(
        allow_blank=True, help_text="why the root left it as it was ('' when changed)"
    )


class GroupChangeResultSerializer(serializers.Serializer):
    command = serializers.UUIDField(help_text="the command sent (/api/v1/commands/)")
    broker = serializers.CharField(help_text="the broker that asked the root")
    address = serializers.CharField(help_text="the member, normalised")
    action = serializers.CharField(help_text="grow or shrink")
    queues = GroupQueueSerializer(
        many=True,
        help_text="one row per quorum queue whose group left the member out (grow) or "
        "named it (shrink); empty when there was none",
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


class GroupChangeView(APIView):
    """Shared by grow and shrink: each subclass names its action and its schema."""

    renderer_classes = [JSONRenderer]
    parser_classes = [SafeJSONParser]
    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]
    change = ""

    def post(self, request: Request) -> Response:
        body = GroupChangeRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        command = groups.change_and_wait(self.change, body.validated_data["address"], request.user)
        result: dict[str, Any] = command.result if isinstance(command.result, dict) else {}
        return Response(
            GroupChangeResultSerializer(
                {
                    "command": command.id,
                    "broker": command.broker.name,
                    "address": members.text(result.get("address")) or command.args["address"],
                    "action": self.change,
                    "queues": groups.outcome(result),
                }
            ).data
        )


GROUP_CHANGE_ANSWERS = (
    "Waits for the broker's answer (up to 40 s): 200 with each queue's answer, its new "
    "group or the root's reason for leaving it (refusals per queue are no error). 400 for "
    "a malformed address; 409 when the broker refuses the command as a whole; 503 when no "
    "broker of a cluster is linked; 504 when the broker did not answer in time (the "
    "command stays open: GET it under /api/v1/commands/)."
)


def _group_change_schema(action: str, description: str) -> Any:
    return extend_schema(
        operation_id=f"queues_{action}",
        summary=f"{action.capitalize()} the quorum groups {'onto' if action == 'grow' else 'off'} "
        "a member",
        description=description + " " + GROUP_CHANGE_ANSWERS,
        request=GroupChangeRequestSerializer,
        responses={
            200: GroupChangeResultSerializer,
            **errors(400, 401, 403, 409, 415, 503, 504),
        },
    )


@_group_change_schema(
    "grow",
    f"Sends `{Command.QUEUES_GROW}` (operators only; audited) to a broker linked to the "
    "console, the root first, as `brokerd ctl queues grow HOST:PORT` (`rabbitmq-queues "
    "grow`) on a server: the running primary at `address` joins every quorum group that "
    "leaves it out. It gets each queue's snapshot and counts for confirms once it holds "
    "the queue. The root refuses a queue failing over or moving, and a member that is not "
    "a live primary.",
)
class GrowView(GroupChangeView):
    change = "grow"


@_group_change_schema(
    "shrink",
    f"Sends `{Command.QUEUES_SHRINK}` (operators only; audited) to a broker linked to the "
    "console, the root first, as `brokerd ctl queues shrink HOST:PORT` (`rabbitmq-queues "
    "shrink`) on a server: the member at `address` leaves every quorum group that names it "
    "and drops its copy. The root refuses a group of fewer than three members (the rest "
    "would not be a majority of it), the queue's owner (move the queue first) and a queue "
    "moving.",
)
class ShrinkView(GroupChangeView):
    change = "shrink"
