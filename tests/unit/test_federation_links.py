"""Federation links without sockets (``brokerd.bridges.federation``): what a link
declares upstream, the ``x-received-from`` trail it adds, the bindings it mirrors,
and the queue link's demand."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.bridges.federated import QueueLink
from brokerd.bridges.federation import (
    EXCHANGE,
    QUEUE,
    FederationTransfer,
    LinkSpec,
    binding_arguments,
    binding_changes,
    binding_key,
)
from brokerd.bridges.transfer import Delivery
from brokerd.bridges.upstreams import parse_upstream
from brokerd.bridges.uri import parse_uri
from brokerd.model.muxers.federation import should_forward
from brokerd.wire import codec
from tests.support.examples import examples


def spec(kind: str = EXCHANGE, **upstream: object) -> LinkSpec:
    value = {"uri": "amqp://u:secret@far:5673/site", **upstream}
    return LinkSpec(kind, "/", "fed.x", parse_upstream("up", value), "fed.x", "rookery@here:5672")


def test_an_exchange_link_declares_its_upstream_side_as_rabbitmq_names_it() -> None:
    link = spec(**{"max-hops": 3, "expires": 60000, "message-ttl": 1000})
    assert link.internal == "federation: fed.x -> rookery@here:5672"
    assert link.upstream_exchange_args() == {
        "x-max-hops": 3,
        "x-downstream-name": "rookery@here:5672",
        "x-downstream-vhost": "/",
    }
    assert link.upstream_queue_args() == {"x-expires": 60000, "x-message-ttl": 1000}
    shovel = link.shovel()
    assert shovel.source.queue == link.internal and shovel.destination.exchange == "fed.x"
    assert shovel.destination.uris[0].local and shovel.ack_mode == "on-confirm"
    assert spec(QUEUE).shovel().source.queue == "fed.x"
    assert spec(QUEUE).shovel().destination.queue == "fed.x"


def _delivered(transfer: FederationTransfer, headers: dict[str, object] | None, redelivered: bool):  # type: ignore[no-untyped-def]
    props = codec.decode_properties(b"\x00\x00")
    props.headers = headers
    delivery = Delivery(1, "fed.x", "eu.1", b"m", codec.encode_properties(props), redelivered)
    [publish] = transfer.delivered(delivery)
    return publish, codec.decode_properties(publish.properties).headers


def test_user_id_crosses_only_a_trusted_link() -> None:
    for trust, kept in ((False, None), (True, "alice")):
        transfer = FederationTransfer(spec(**{"trust-user-id": trust}), "node")
        props = codec.decode_properties(b"\x00\x00")
        props.user_id = "alice"
        delivery = Delivery(1, "fed.x", "k", b"m", codec.encode_properties(props))
        [publish] = transfer.delivered(delivery)
        assert codec.decode_properties(publish.properties).user_id == kept


def test_a_carried_message_gains_an_entry_and_keeps_its_key() -> None:
    transfer = FederationTransfer(spec(), "node")
    transfer.upstream_name = "site-a"
    transfer.upstream_uri = parse_uri("amqp://u:secret@far:5673/site")
    publish, headers = _delivered(transfer, {"x-received-from": [{"cluster-name": "z"}]}, True)
    assert (publish.exchange, publish.routing_key, publish.body) == ("fed.x", "eu.1", b"m")
    first, older = headers["x-received-from"]
    assert first == {
        "uri": "amqp://u:***@far:5673/site",
        "exchange": "fed.x",
        "redelivered": True,
        "cluster-name": "site-a",
        "vhost": "site",
    }
    assert older == {"cluster-name": "z"} and headers["x-redelivered"] is True
    assert "secret" not in repr(headers)
    # a queue link publishes to the queue, through the default exchange
    queue = FederationTransfer(spec(QUEUE), "node")
    publish, headers = _delivered(queue, None, False)
    assert (publish.exchange, publish.routing_key) == ("", "fed.x")
    assert headers["x-received-from"][0]["queue"] == "fed.x" and "x-redelivered" not in headers


@given(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=8))
@settings(max_examples=examples(60))
def test_a_trail_stops_at_max_hops_on_the_way_back_upstream(hops: int, crossed: int) -> None:
    """However many links a message crossed, the upstream exchange of a link with
    ``max-hops`` N passes it on only while the trail is shorter than N."""
    transfer = FederationTransfer(spec(), "node")
    headers: dict[str, object] | None = None
    for i in range(crossed):
        transfer.upstream_name = f"site-{i}"
        _, headers = _delivered(transfer, headers, False)
    trail = (headers or {}).get("x-received-from", [])
    assert len(trail) == crossed  # type: ignore[arg-type]
    assert should_forward(headers or {}, hops, "elsewhere", "/") is (crossed < hops)


keys = st.sets(
    st.builds(
        binding_key,
        st.sampled_from(["a", "b.#", "*.c", ""]),
        st.sampled_from([None, {}, {"x-match": "all", "k": 1}]),
    )
)


@given(keys, keys)
@settings(max_examples=examples(80))
def test_mirrored_bindings_end_equal_to_the_downstreams(bound: set, wanted: set) -> None:  # type: ignore[type-arg]
    add, remove = binding_changes(bound, wanted)
    assert (bound | set(add)) - set(remove) == wanted
    assert not set(add) & bound and set(remove) <= bound
    for key in add:
        args = binding_arguments(key)
        assert binding_key(key[0], args) == key


def test_a_queue_link_consumes_only_while_consumers_here_have_nothing() -> None:
    state = {"demand": (0, 0)}
    link = QueueLink(
        spec(QUEUE, **{"prefetch-count": 10}), node="n", local=None, demand=lambda: state["demand"]
    )  # type: ignore[arg-type]
    assert not link.wants()  # nobody consumes here
    state["demand"] = (2, 3)
    assert not link.wants()  # they have something
    state["demand"] = (2, 0)
    assert link.wants()
    link.consuming = "tag"
    state["demand"] = (2, 9)
    assert link.wants()  # keeps going until a window is ready
    state["demand"] = (2, 10)
    assert not link.wants()
    state["demand"] = (0, 0)
    assert not link.wants()


def test_a_link_down_raises_federation_down_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from brokerd.bridges.federation_service import FederationService, Objects
    from brokerd.bridges.runner import STARTING, TERMINATED

    service = FederationService(
        tmp_path / "federation.json",
        node="n",
        downstream="here",
        local=lambda: None,
        objects=Objects(lambda _v: [], lambda _v: [], lambda _v, _x: set(), lambda _v, _q: (0, 0)),
    )
    link = QueueLink(spec(QUEUE), node="n", local=None, demand=lambda: (0, 0))
    service.runners[link.spec.key] = link
    link.state, link.reason, link.down_since = STARTING, "source: cannot connect", 100.0
    assert service.alarm(now=110.0) is None  # not down long enough yet
    alarm = service.alarm(now=131.0)
    assert alarm is not None and alarm["kind"] == "federation-down" and alarm["since"] == 100.0
    assert "queue fed.x (vhost /) from up" in alarm["message"]
    link.state = TERMINATED  # refused: at once
    assert service.alarm(now=100.5) is not None
    link.down_since = None
    assert service.alarm(now=500.0) is None
