"""The console link over ``wss://``: real brokerd processes and the real console (Daphne
serving TLS with certificates from a throwaway CA), no stand-in for either side.

One console per module, with two TLS ports: one whose certificate names 127.0.0.1,
one whose certificate (from the same CA) names another host. A broker that trusts
the CA links over the first; a broker that trusts another CA, or that reaches the
second, is refused by its own verification, says so in its log once, stays up
and keeps retrying.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.brokerd_process import BrokerProcess
from tests.console_stack import OPERATOR, Api, ConsoleStack, print_logs
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

GOOD, WRONG_NAME = 0, 1  # the stack's TLS ports
VERIFY_FAILED = "console link: certificate verify failed"


class Certificates:
    """PEM files of a CA that issued the console's certificates, and of one that did not."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        ca = trustme.CA()
        self.cafile = self._write("ca.pem", ca.cert_pem)
        self.other_cafile = self._write("other-ca.pem", trustme.CA().cert_pem)
        self.good = self._issue(ca, "good", "127.0.0.1")
        self.wrong_name = self._issue(ca, "wrong-name", "other.example")

    def _write(self, name: str, blob: trustme.Blob) -> Path:
        path = self.root / name
        blob.write_to_path(str(path))
        return path

    def _issue(self, ca: trustme.CA, name: str, host: str) -> tuple[Path, Path]:
        leaf = ca.issue_cert(host)
        certfile = self._write(f"{name}.pem", leaf.cert_chain_pems[0])
        keyfile = self._write(f"{name}.key", leaf.private_key_pem)
        return certfile, keyfile


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[ConsoleStack]:
    """The console with Daphne on plain HTTP (the API) and on two TLS ports."""
    stack = ConsoleStack(
        tmp_path_factory.mktemp("console-tls"), tls_endpoints=[certs.good, certs.wrong_name]
    )
    failed_before = request.session.testsfailed
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        if request.session.testsfailed > failed_before:
            print_logs(request, stack)


@pytest.fixture
def brokers() -> Iterator[list[BrokerProcess]]:
    """The test's brokers, stopped at the end. Their logs are printed then: pytest
    shows a test's captured output only when it failed."""
    started: list[BrokerProcess] = []
    yield started
    for proc in started:
        proc.stop()
        print(f"===== {proc.log_path} =====\n{proc.log_text()[-6000:]}")


def start_broker(
    stack: ConsoleStack, brokers: list[BrokerProcess], path: Path, url: str, *extra: str
) -> BrokerProcess:
    proc = BrokerProcess(
        path,
        extra_args=["--console", url, f"--console-token={stack.broker_token}", *extra],
    )
    brokers.append(proc)
    return proc.start()


def broker_in_console(api: Api, proc: BrokerProcess) -> dict | None:
    """The console's record of ``proc`` while it is up and linked, else None."""
    name = f"127.0.0.1:{proc.port}"
    for broker in api.items("/api/v1/brokers/"):
        if broker["name"] == name and broker["state"] == "up" and broker["connected"]:
            return broker
    return None


def known_to_console(api: Api, proc: BrokerProcess) -> bool:
    return any(b["name"] == f"127.0.0.1:{proc.port}" for b in api.items("/api/v1/brokers/"))


def refused_and_retrying(proc: BrokerProcess, retries: int = 3) -> str:
    """The broker's log once it failed verification and retried ``retries`` times."""

    def enough() -> str | None:
        text = proc.log_text()
        if VERIFY_FAILED in text and text.count("console link retry in") >= retries:
            return text
        return None

    return eventually(enough, 15, f"verify failure and {retries} retries", explain=proc.log_text)


def test_wss_with_the_issuing_ca_links_and_the_console_sees_the_broker(
    stack: ConsoleStack, certs: Certificates, brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    proc = start_broker(
        stack, brokers, tmp_path / "b", stack.wss_url(GOOD), "--console-cafile", str(certs.cafile)
    )
    api = stack.api(OPERATOR)
    stack.wait(lambda: broker_in_console(api, proc), 20, "broker up in the console")
    log = proc.log_text()
    assert re.search(rf"console link up url={re.escape(stack.wss_url(GOOD))} tls=TLSv1\.[23]", log)
    assert "certificate verify failed" not in log


def test_a_ca_that_did_not_issue_the_certificate_is_refused_then_a_new_bundle_is_used(
    stack: ConsoleStack, certs: Certificates, brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    """Verification fails against a CA that did not issue the console's certificate;
    the failure is logged once however often it repeats, AMQP is unaffected, and the
    bundle is re-read at each attempt: replacing it lets the link come up."""
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(certs.other_cafile.read_bytes())
    proc = start_broker(
        stack, brokers, tmp_path / "b", stack.wss_url(GOOD), "--console-cafile", str(bundle)
    )
    log = refused_and_retrying(proc)
    assert proc.alive()
    failures = [line for line in log.splitlines() if VERIFY_FAILED in line]
    assert len(failures) == 1, failures  # once per distinct error, not once per retry
    assert "ERROR" in failures[0]
    assert "unable to get local issuer certificate" in failures[0], failures[0]
    assert f"--console-cafile {bundle}" in failures[0]
    assert "console link up" not in log
    api = stack.api(OPERATOR)
    assert not known_to_console(api, proc)

    bundle.write_bytes(certs.cafile.read_bytes())
    # the backoff is 4 s (+-25 %) by now: the next attempt reads the new bundle
    stack.wait(lambda: broker_in_console(api, proc), 20, "broker up after the CA was replaced")
    assert proc.log_text().count(VERIFY_FAILED) == 1


def test_a_certificate_for_another_host_name_is_refused(
    stack: ConsoleStack, certs: Certificates, brokers: list[BrokerProcess], tmp_path: Path
) -> None:
    """The CA is trusted, but the certificate names other.example, not 127.0.0.1."""
    proc = start_broker(
        stack,
        brokers,
        tmp_path / "b",
        stack.wss_url(WRONG_NAME),
        "--console-cafile",
        str(certs.cafile),
    )
    log = refused_and_retrying(proc)
    assert proc.alive()
    failures = [line for line in log.splitlines() if VERIFY_FAILED in line]
    assert len(failures) == 1, failures
    assert "mismatch" in failures[0] and "127.0.0.1" in failures[0], failures[0]
    assert "console link up" not in log
    assert not known_to_console(stack.api(OPERATOR), proc)


WS, WSS = "ws://127.0.0.1:1/ws/brokers/", "wss://127.0.0.1:1/ws/brokers/"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--console", WS, "--console-cafile", "{ca}"], "needs a wss:// console URL"),
        (["--console", WSS, "--console-cafile", "{missing}"], "No such file or directory"),
        (["--console", WSS, "--console-cafile", "{not_pem}"], "is not a PEM CA bundle"),
        (["--console-cafile", "{ca}"], "--console-cafile needs --console"),
    ],
    ids=["ws-url", "missing-file", "not-pem", "no-console"],
)
def test_unusable_console_cafile_exits_2(
    tmp_path: Path, certs: Certificates, args: list[str], message: str
) -> None:
    """Refused at startup (not at the first link attempt), without a console running."""
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    files = {"ca": certs.cafile, "missing": tmp_path / "missing.pem", "not_pem": not_pem}
    argv = [arg.format(**files) for arg in args]
    if "--console" in argv:
        argv.append("--console-token=t")
    proc = BrokerProcess(tmp_path / "b", extra_args=argv)
    with pytest.raises(RuntimeError, match="exited with 2"):
        proc.start()
    assert message in proc.log_text()


def test_cafile_from_the_environment_with_a_ws_url_exits_2(
    tmp_path: Path, certs: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROOKERY_CONSOLE_CAFILE", str(certs.cafile))
    args = ["--console", WS, "--console-token=t"]
    proc = BrokerProcess(tmp_path / "b", extra_args=args)
    with pytest.raises(RuntimeError, match="exited with 2"):
        proc.start()
    assert "ROOKERY_CONSOLE_CAFILE: a CA file" in proc.log_text()
