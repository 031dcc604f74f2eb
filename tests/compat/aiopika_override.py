"""Appended to a copy of aio-pika's tests/conftest.py by ``run_compat``.

aio-pika's fixtures start RabbitMQ in docker; these replace the docker ones
with the broker named by ROOKERY_COMPAT_AMQP_URL (a brokerd started on a free
port, or a RabbitMQ for comparison). Later definitions of a name win, so the
original fixtures that build on ``amqp_direct_url`` keep working unchanged.

``test_amqps.py`` builds its AMQPS URL from ``rabbitmq_container`` (host, and
the port mapped to "5671/tcp"): with ROOKERY_COMPAT_AMQPS_URL set (``run_compat
--tls``) that fixture names the broker's TLS listener; without it, it skips as
before.
"""

import os as _os

import pytest as _pytest
from yarl import URL as _URL


def pytest_configure(config):
    return None


@_pytest.fixture(scope="session")
def docker():
    _pytest.skip("needs docker (a second broker container); not part of the brokerd run")


@_pytest.fixture(scope="session")
def rabbitmq_container():
    amqps = _os.environ.get("ROOKERY_COMPAT_AMQPS_URL")
    if not amqps:
        _pytest.skip("needs the docker RabbitMQ container (TLS port, management API)")
    from tests.docker_client import ContainerInfo

    plain, tls = _URL(_os.environ["ROOKERY_COMPAT_AMQP_URL"]), _URL(amqps)
    return ContainerInfo(
        id="rookery-compat",
        ports={"5672/tcp": plain.port, "5671/tcp": tls.port},
        host=tls.host,
    )


@_pytest.fixture(scope="session")
def amqp_direct_url():
    return _URL(_os.environ["ROOKERY_COMPAT_AMQP_URL"])
