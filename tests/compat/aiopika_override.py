"""Appended to a copy of aio-pika's tests/conftest.py by ``run_compat``.

aio-pika's fixtures start RabbitMQ in docker; these replace the docker ones
with the broker named by ROOKERY_COMPAT_AMQP_URL (a brokerd started on a free
port, or a RabbitMQ for comparison). Later definitions of a name win, so the
original fixtures that build on ``amqp_direct_url`` keep working unchanged.
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
    _pytest.skip("needs the docker RabbitMQ container (TLS port, management API)")


@_pytest.fixture(scope="session")
def amqp_direct_url():
    return _URL(_os.environ["ROOKERY_COMPAT_AMQP_URL"])
