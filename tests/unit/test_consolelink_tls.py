"""The console link's TLS context (brokerd/consolelink/tls.py), its startup checks in
the command line, and how a TLS failure is logged. Handshakes run in memory between
two ``SSLObject``s: no socket, no process."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest
import trustme

from brokerd.cli import build_parser, console_cafile_problem
from brokerd.consolelink.link import ConsoleLink
from brokerd.consolelink.tls import ConsoleTLSError, client_context, describe_failure

WSS = "wss://127.0.0.1:8443/ws/brokers/"
WS = "ws://127.0.0.1:8000/ws/brokers/"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def cafile(tmp_path: Path, ca: trustme.CA) -> Path:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def server_context(ca: trustme.CA, host: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(host).configure_cert(context)
    return context


def handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str) -> str:
    """Run a TLS handshake between the two contexts in memory; the version agreed.
    Raises the client's ``SSLError`` when it refuses the server."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_side=False, server_hostname=hostname)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                except ssl.SSLError:
                    if side is s:  # the server learns of the client's refusal: ignore
                        done[name] = True
                    else:
                        raise
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            version = c.version()
            assert version is not None
            return version
    raise AssertionError("handshake did not finish")


def test_ws_without_a_cafile_has_no_context() -> None:
    assert client_context(WS) is None


def test_ws_with_a_cafile_is_refused(cafile: Path) -> None:
    with pytest.raises(ConsoleTLSError, match=r"needs a wss:// console URL"):
        client_context(WS, cafile)


def test_wss_always_verifies_with_the_system_store_by_default() -> None:
    context = client_context(WSS)
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_wss_with_a_cafile_trusts_that_ca(cafile: Path, ca: trustme.CA) -> None:
    context = client_context(WSS, cafile)
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert len(context.get_ca_certs()) == 1
    assert handshake(context, server_context(ca, "127.0.0.1"), "127.0.0.1") in (
        "TLSv1.2",
        "TLSv1.3",
    )


def test_a_certificate_from_another_ca_fails_verification(cafile: Path) -> None:
    context = client_context(WSS, cafile)
    assert context is not None
    with pytest.raises(ssl.SSLCertVerificationError) as failure:
        handshake(context, server_context(trustme.CA(), "127.0.0.1"), "127.0.0.1")
    assert describe_failure(failure.value) == (
        "certificate verify failed: unable to get local issuer certificate"
    )


def test_a_certificate_for_another_name_fails_verification(cafile: Path, ca: trustme.CA) -> None:
    context = client_context(WSS, cafile)
    assert context is not None
    with pytest.raises(ssl.SSLCertVerificationError) as failure:
        handshake(context, server_context(ca, "other.example"), "console.example.com")
    text = describe_failure(failure.value)
    assert text.startswith("certificate verify failed: Hostname mismatch"), text
    assert "console.example.com" in text


def test_a_plain_http_server_is_a_tls_failure(cafile: Path) -> None:
    """wss:// to a port that answers in plain HTTP: said as a TLS failure, not a
    certificate one, in OpenSSL's words without its source line."""
    context = client_context(WSS, cafile)
    assert context is not None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    incoming.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(ssl.SSLError) as failure:
        client.do_handshake()
    text = describe_failure(failure.value)
    assert text.startswith("TLS failed: ") and "_ssl.c" not in text, text


def test_a_missing_cafile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConsoleTLSError, match="No such file or directory"):
        client_context(WSS, tmp_path / "missing.pem")


def test_a_cafile_without_a_certificate_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.pem"
    path.write_text("-----BEGIN NOTHING-----\n")
    with pytest.raises(ConsoleTLSError, match="is not a PEM CA bundle"):
        client_context(WSS, path)


def test_the_command_line_names_the_option_or_the_variable(cafile: Path) -> None:
    assert console_cafile_problem(WSS, cafile) is None
    assert console_cafile_problem(WSS, None) is None
    assert console_cafile_problem(WS, None) is None
    problem = console_cafile_problem(WS, cafile)
    assert problem is not None and problem.startswith("--console-cafile: ")
    problem = console_cafile_problem(WS, cafile, "ROOKERY_CONSOLE_CAFILE")
    assert problem is not None and problem.startswith("ROOKERY_CONSOLE_CAFILE: ")


def test_the_option_is_parsed_and_documented() -> None:
    parser = build_parser()
    args = parser.parse_args(["--console", WSS, "--console-cafile", "/etc/rookery/ca.pem"])
    assert args.console_cafile == Path("/etc/rookery/ca.pem")
    assert parser.parse_args([]).console_cafile is None
    assert "--console-cafile FILE" in parser.format_help()


def test_the_link_refuses_ws_with_a_cafile_when_built(cafile: Path) -> None:
    with pytest.raises(ConsoleTLSError):
        ConsoleLink(object(), WS, "token", cafile)  # type: ignore[arg-type]


def test_a_tls_failure_is_logged_once_while_it_repeats(
    cafile: Path, caplog: pytest.LogCaptureFixture
) -> None:
    link = ConsoleLink(object(), WSS, "token", cafile)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG, logger="brokerd.console")
    mismatch = "certificate verify failed: Hostname mismatch"
    for failure in (mismatch, mismatch, mismatch, "TLS failed: EOF", None, mismatch):
        link._report_tls(failure)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3, errors  # the repeats only at DEBUG; after a success, again
    assert errors[0].startswith(f"console link: {mismatch} url={WSS}")
    assert f"must chain to --console-cafile {cafile}" in errors[0]
    assert errors[1] == f"console link: TLS failed: EOF url={WSS}"
    assert errors[2] == errors[0]
