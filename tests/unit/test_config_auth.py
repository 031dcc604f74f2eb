"""Password hashes, permissions, the user database and brokerd.toml parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.config import ConfigError, default_config, load_config, parse_config
from brokerd.model.auth import (
    HASH_ITERATIONS,
    Permission,
    User,
    UserDatabase,
    check_password,
    hash_password,
    is_loopback,
)
from brokerd.model.errors import ACCESS_REFUSED, ChannelError

FAST = 1000  # iterations for hashes made in tests


# -- hashes ---------------------------------------------------------------------------


def test_hash_password_format_and_check():
    encoded = hash_password("s3cret")
    algorithm, iterations, salt, digest = encoded.split("$")
    assert algorithm == "pbkdf2_sha256"
    assert int(iterations) == HASH_ITERATIONS
    assert salt and digest
    assert check_password("s3cret", encoded)
    assert not check_password("s3cret ", encoded)
    assert not check_password("", encoded)


def test_hashes_are_salted():
    a, b = hash_password("same", iterations=FAST), hash_password("same", iterations=FAST)
    assert a != b
    assert check_password("same", a) and check_password("same", b)
    assert hash_password("x", iterations=FAST, salt="abc") == hash_password(
        "x", iterations=FAST, salt="abc"
    )


def test_check_password_matches_djangos_format():
    # pbkdf2_sha256$1000$salt$... computed independently with hashlib
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.pbkdf2_hmac("sha256", b"pw", b"salt", 1000)).decode()
    assert check_password("pw", f"pbkdf2_sha256$1000$salt${digest}")


@pytest.mark.parametrize(
    "encoded",
    ["", "plain-text", "pbkdf2_sha256$x$salt$abc", "md5$1$salt$abc", "pbkdf2_sha256$1000$salt"],
)
def test_check_password_refuses_malformed_hashes(encoded):
    assert check_password("pw", encoded) is False


def test_unicode_passwords():
    encoded = hash_password("pässwörd ✓", iterations=FAST)
    assert check_password("pässwörd ✓", encoded)
    assert not check_password("passwo rd", encoded)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("10.0.0.5", False),
        ("::ffff:10.0.0.5", False),
        ("example.org", False),
        ("0.0.0.0", False),
    ],
)
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


# -- permissions ------------------------------------------------------------------------


def test_permission_regexes_are_searched_as_rabbitmq_does():
    p = Permission(configure="^app\\.", write="app\\.(in|out)$", read="")
    assert p.allows("configure", "app.queue")  # '^app\.' grants every 'app.' name
    assert not p.allows("configure", "other.app.queue")
    assert p.allows("write", "app.in")
    assert p.allows("write", "my.app.out")  # unanchored at the start: found inside
    assert not p.allows("write", "app.input")  # '$' anchors the end
    assert not p.allows("read", "")  # an empty pattern grants nothing
    assert not p.allows("read", "anything")


def test_default_permission_allows_everything():
    p = Permission()
    for kind in ("configure", "write", "read"):
        assert p.allows(kind, "")
        assert p.allows(kind, "amq.gen-xyz")


@pytest.fixture
def users() -> UserDatabase:
    db = UserDatabase()
    db.add_user(User("app", hash_password("pw", iterations=FAST)))
    db.add_user(User("guest", hash_password("guest", iterations=FAST), loopback_only=True))
    db.set_permission(
        "app", "/", Permission(configure="app-.*", write="app-.*|amq\\.topic", read=".*")
    )
    db.set_permission("guest", "/", Permission())
    return db


def test_authenticate(users):
    user, reason = users.authenticate("app", "pw", "10.0.0.5")
    assert user is not None and user.name == "app" and reason == ""
    assert users.authenticate("app", "pw", "10.0.0.5")[0] is user  # cached path
    user, reason = users.authenticate("app", "wrong", "127.0.0.1")
    assert user is None and "invalid credentials" in reason
    user, reason = users.authenticate("nobody", "pw", "127.0.0.1")
    assert user is None and "does not exist" in reason


def test_guest_is_loopback_only(users):
    assert users.authenticate("guest", "guest", "127.0.0.1")[0] is not None
    assert users.authenticate("guest", "guest", "::1")[0] is not None
    user, reason = users.authenticate("guest", "guest", "10.0.0.5")
    assert user is None and "localhost" in reason


def test_replacing_a_user_drops_the_cached_login(users):
    assert users.authenticate("app", "pw", "127.0.0.1")[0] is not None
    users.add_user(User("app", hash_password("new", iterations=FAST)))
    assert users.authenticate("app", "pw", "127.0.0.1")[0] is None
    assert users.authenticate("app", "new", "127.0.0.1")[0] is not None


def test_permission_check_raises_403(users):
    app = users.users["app"]
    users.check(app, "/", "configure", "queue", "app-q")
    users.check(app, "/", "write", "exchange", "amq.topic")
    with pytest.raises(ChannelError) as info:
        users.check(app, "/", "configure", "queue", "other")
    assert info.value.reply_code == ACCESS_REFUSED
    assert "access to queue 'other' in vhost '/' refused for user 'app'" in info.value.text
    with pytest.raises(ChannelError):
        users.check(app, "/other", "read", "queue", "app-q")  # no permission on that vhost
    assert users.can_access_vhost("app", "/")
    assert not users.can_access_vhost("app", "/other")


# -- config files ------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "brokerd.toml"
    path.write_text(text)
    return path


def test_no_file_is_rabbitmqs_default():
    config = load_config(None)
    assert config.vhosts == ["/"]
    assert [u.name for u in config.users] == ["guest"]
    assert config.users[0].loopback_only
    db = config.user_database()
    assert db.authenticate("guest", "guest", "127.0.0.1")[0] is not None
    assert db.authenticate("guest", "guest", "192.168.1.1")[0] is None
    assert default_config().limits.frame_max == config.limits.frame_max


def test_full_config(tmp_path):
    pw = hash_password("pw", iterations=FAST)
    path = write(
        tmp_path,
        f"""
[limits]
frame_max = 65536
heartbeat = 30
channel_max = 100

[[vhosts]]
name = "/"

[[vhosts]]
name = "prod"

[[users]]
name = "app"
password_hash = "{pw}"
tags = ["administrator"]

[[permissions]]
user = "app"
vhost = "prod"
configure = "^app-.*"
read = ".*"
write = ""
""",
    )
    config = load_config(path)
    assert config.vhosts == ["/", "prod"]
    assert (config.limits.frame_max, config.limits.heartbeat, config.limits.channel_max) == (
        65536,
        30,
        100,
    )
    assert [(u.name, u.tags, u.loopback_only) for u in config.users] == [
        ("app", ("administrator",), False)
    ]
    db = config.user_database()
    assert db.authenticate("app", "pw", "10.1.1.1")[0] is not None
    assert "guest" not in db.users  # a file with users replaces the default guest
    assert db.can_access_vhost("app", "prod") and not db.can_access_vhost("app", "/")
    perm = db.permissions[("app", "prod")]
    assert perm.allows("configure", "app-x") and not perm.allows("write", "x")


def test_config_without_users_keeps_guest(tmp_path):
    config = load_config(write(tmp_path, '[[vhosts]]\nname = "/"\n[[vhosts]]\nname = "b"\n'))
    assert [u.name for u in config.users] == ["guest"]
    assert [(u, v) for u, v, _ in config.permissions] == [("guest", "/")]


def test_guest_in_a_file_is_loopback_only_unless_said_otherwise(tmp_path):
    pw = hash_password("guest", iterations=FAST)
    config = load_config(write(tmp_path, f'[[users]]\nname = "guest"\npassword_hash = "{pw}"\n'))
    assert config.users[0].loopback_only
    config = load_config(
        write(
            tmp_path, f'[[users]]\nname = "guest"\npassword_hash = "{pw}"\nloopback_only = false\n'
        )
    )
    assert not config.users[0].loopback_only


GOOD_HASH = "pbkdf2_sha256$1000$salt$abc="


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nonsense]\na = 1\n", "unknown section(s) nonsense"),
        ("[limits]\nframe_mux = 1\n", "unknown limit 'frame_mux'"),
        ('[limits]\nheartbeat = "60"\n', "limit 'heartbeat' must be a non-negative integer"),
        ("[limits]\nheartbeat = -1\n", "limit 'heartbeat' must be a non-negative integer"),
        ("[limits]\nheartbeat = true\n", "limit 'heartbeat' must be a non-negative integer"),
        ("[limits]\nframe_max = 1000\n", "frame_max must be at least 4096"),
        ('[[vhosts]]\nname = ""\n', "vhosts[0].name: a vhost name must be a non-empty string"),
        ("[[vhosts]]\nnom = 'x'\n", "vhosts[0].name: a vhost name must be a non-empty string"),
        ('[[users]]\npassword_hash = "x"\n', "users[0].name: every user needs a non-empty 'name'"),
        ('[[users]]\nname = "bob"\n', "user 'bob' needs a 'password_hash'"),
        (
            '[[users]]\nname = "bob"\npassword_hash = "plain"\n',
            "user 'bob' needs a 'password_hash'",
        ),
        (
            f'[[users]]\nname = "bob"\npassword_hash = "{GOOD_HASH}"\n'
            '[[permissions]]\nuser = "alice"\n',
            "permission for unknown user 'alice'",
        ),
        (
            f'[[users]]\nname = "bob"\npassword_hash = "{GOOD_HASH}"\n'
            '[[permissions]]\nuser = "bob"\nvhost = "nowhere"\n',
            "permission on unknown vhost 'nowhere'",
        ),
        (
            f'[[users]]\nname = "bob"\npassword_hash = "{GOOD_HASH}"\n'
            '[[permissions]]\nuser = "bob"\nread = "(unclosed"\n',
            "bad read pattern for 'bob'",
        ),
    ],
)
def test_config_errors_name_the_problem(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)  # which file


def test_missing_config_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError, match=r"cannot read config file .*absent\.toml"):
        load_config(path)


def test_invalid_toml(tmp_path):
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(write(tmp_path, "[limits\nframe_max = \n"))


def test_parse_config_where_defaults_to_config():
    with pytest.raises(ConfigError, match=r"^config: unknown section"):
        parse_config({"bogus": {}})


@pytest.mark.parametrize(
    "text",
    ['[users]\nname = "x"\n', 'users = ["x"]\n', "limits = 5\n"],
    ids=["users-table", "users-strings", "limits-int"],
)
def test_wrongly_shaped_sections_are_config_errors(tmp_path, text):
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, text))


def test_tags_must_be_a_list(tmp_path):
    text = f'[[users]]\nname = "bob"\npassword_hash = "{GOOD_HASH}"\ntags = "administrator"\n'
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, text))
