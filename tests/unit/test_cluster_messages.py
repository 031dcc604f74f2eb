"""Cluster statuses on the wire (``brokerd.cluster.messages``): what a server says
of itself survives the trip, and a malformed field is an error, not a crash."""

from __future__ import annotations

import json

import pytest

from brokerd.cluster.messages import MessageError, Status, decode, encode


def status(**fields: object) -> Status:
    base = {
        "spid": "s1",
        "type": "primary",
        "start_time": 1.0,
        "checksum": "c",
        "root_enabled": True,
        "vote": "s1",
        "is_root": False,
        "listed": True,
        "address": "127.0.0.1:5701",
    }
    return Status(**(base | fields))  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["stopping", "holds_state"])
def test_a_flag_travels_and_an_older_status_without_it_means_false(field: str) -> None:
    """``stopping`` (a planned stop), ``holds_state`` (wiring recovered from disk)."""
    kind, body = encode(status(**{field: True}))
    back = decode(kind, body)
    assert isinstance(back, Status) and getattr(back, field)
    data = json.loads(body)
    del data[field]  # a server from before the field
    back = decode(kind, json.dumps(data).encode())
    assert isinstance(back, Status) and not getattr(back, field)


@pytest.mark.parametrize(("field", "bad"), [("stopping", "yes"), ("holds_state", 1)])
def test_a_flag_that_is_not_a_boolean_is_refused(field: str, bad: object) -> None:
    kind, body = encode(status())
    data = json.loads(body) | {field: bad}
    with pytest.raises(MessageError, match=f"{field} must be a boolean"):
        decode(kind, json.dumps(data).encode())


def test_recovered_copies_travel_and_an_older_status_has_none() -> None:
    """A whole-cluster restart's root chooses a queue's owner from these when its
    last owner does not come back (``Placer._recover_elsewhere``)."""
    kind, body = encode(status(recovered={"q": 350, "r": 0, "s": -1}))  # -1: no copy
    back = decode(kind, body)
    assert isinstance(back, Status) and back.recovered == {"q": 350, "r": 0, "s": -1}
    data = json.loads(body)
    del data["recovered"]
    back = decode(kind, json.dumps(data).encode())
    assert isinstance(back, Status) and back.recovered == {}


@pytest.mark.parametrize("bad", [{"q": -2}, {"q": True}, {"q": "7"}, {"q": 1.5}, ["q"], None])
def test_a_malformed_recovered_copy_is_refused(bad: object) -> None:
    kind, body = encode(status())
    data = json.loads(body) | {"recovered": bad}
    with pytest.raises(MessageError, match="recovered"):
        decode(kind, json.dumps(data).encode())


def test_the_state_log_place_travels_and_an_older_status_has_none() -> None:
    """The election prefers the server furthest along the last root's state log."""
    kind, body = encode(status(state_source="r0", state_seq=10))
    back = decode(kind, body)
    assert isinstance(back, Status) and (back.state_source, back.state_seq) == ("r0", 10)
    data = json.loads(body)
    del data["state_source"]
    back = decode(kind, json.dumps(data).encode())
    assert isinstance(back, Status) and back.state_source is None


@pytest.mark.parametrize(
    ("field", "bad"),
    [("state_source", 5), ("state_source", ["r0"]), ("state_seq", -1), ("state_seq", True)],
)
def test_a_malformed_state_log_place_is_refused(field: str, bad: object) -> None:
    kind, body = encode(status())
    data = json.loads(body) | {field: bad}
    with pytest.raises(MessageError, match=field):
        decode(kind, json.dumps(data).encode())
