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


def test_a_stopping_server_says_so_and_an_older_status_means_not_stopping() -> None:
    kind, body = encode(status(stopping=True))
    back = decode(kind, body)
    assert isinstance(back, Status) and back.stopping
    data = json.loads(body)
    del data["stopping"]  # a server from before the field
    back = decode(kind, json.dumps(data).encode())
    assert isinstance(back, Status) and not back.stopping


def test_a_stopping_field_that_is_not_a_boolean_is_refused() -> None:
    kind, body = encode(status())
    data = json.loads(body) | {"stopping": "yes"}
    with pytest.raises(MessageError, match="stopping must be a boolean"):
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


def test_holds_state_travels_and_must_be_a_boolean() -> None:
    kind, body = encode(status(holds_state=True))
    back = decode(kind, body)
    assert isinstance(back, Status) and back.holds_state
    data = json.loads(body)
    del data["holds_state"]  # a server from before the field
    back = decode(kind, json.dumps(data).encode())
    assert isinstance(back, Status) and not back.holds_state
    with pytest.raises(MessageError, match="holds_state must be a boolean"):
        decode(kind, json.dumps(data | {"holds_state": 1}).encode())
