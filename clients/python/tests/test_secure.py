"""Bearer tokens, TLS and client certificates against a server that requires them."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

import fenced
from support import Server, missing


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    token = tmp_path_factory.mktemp("auth") / "token"
    token.write_text("s3cret\n")
    s = Server(["--auth-token-file", str(token)])
    yield s
    s.stop()


def test_the_auth_token_is_sent_and_its_absence_is_a_typed_error(auth_server: Server, name: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FENCED_AUTH_TOKEN", raising=False)
    with pytest.raises(fenced.Unauthorized) as e:
        fenced.Client(auth_server.url).try_lock(name)
    assert e.value.status == 401 and e.value.code == "unauthorized"
    with pytest.raises(fenced.Unauthorized):
        fenced.Client(auth_server.url, auth_token="wrong").store.get(name)
    c = fenced.Client(auth_server.url, auth_token="s3cret")
    with c.lock(name, ttl=0.6) as lock:
        time.sleep(1.5)
        assert lock.is_valid(), f"keepalives carry the token too: {lock.lost_reason}"
        c.store.put(name, b"v", token=lock.token)
    monkeypatch.setenv("FENCED_AUTH_TOKEN", "s3cret")
    fenced.Client(auth_server.url).try_lock(name).release()


def test_a_keepalive_refused_for_its_credentials_loses_the_lock_at_once(auth_server: Server, name: str) -> None:
    c = fenced.Client(auth_server.url, auth_token="s3cret")
    lock = c.lock(name, ttl=3.0)
    c._http.headers["authorization"] = "Bearer revoked"  # the credential taken away meanwhile
    assert lock.lost.wait(timeout=3.0)
    assert lock.lost_reason is fenced.LostReason.UNAUTHORIZED
    assert time.monotonic() < lock.valid_until, "at once, not at the deadline"


def _openssl(d: Path, *args: str) -> None:
    out = subprocess.run(["openssl", *args], cwd=d, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode(errors="replace")


def _certs(d: Path) -> None:
    """A CA and a leaf for 127.0.0.1 signed by it, with openssl."""
    def run(*args: str) -> None:
        _openssl(d, *args)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=fenced test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                           "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                           "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "cert.pem", "-days", "2", "-extfile", "ext")


def test_https_with_the_servers_ca(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("openssl") is None:
        missing("openssl is needed to make the test's certificates")
    _certs(tmp_path)
    s = Server(["--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")], scheme="https")
    try:
        c = fenced.Client(s.url, ca_file=str(tmp_path / "ca.pem"))
        with c.lock(name, ttl=5.0) as lock:
            assert c.store.put(name, b"v", token=lock.token) == lock.token
        monkeypatch.setenv("FENCED_CA_FILE", str(tmp_path / "ca.pem"))
        fenced.Client(s.url).try_lock(name).release()
        monkeypatch.delenv("FENCED_CA_FILE")
        # A server whose certificate does not chain to a trusted root is not talked to.
        with pytest.raises(fenced.Transport):
            fenced.Client(s.url).try_lock(name)
    finally:
        s.stop()


# --- client certificates (mutual TLS) ------------------------------------------------------

_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _client_ca(d: Path, ca: str) -> None:
    _openssl(d, "req", "-x509", *_EC, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
             "-subj", f"/CN=fenced test {ca}")


def _client_cert(d: Path, ca: str, leaf: str, subj: str) -> None:
    """A client certificate (clientAuth) for ``subj``, signed by the CA ``ca``, as
    docs/server.md makes them."""
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    _openssl(d, "req", "-new", *_EC, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", subj)
    _openssl(d, "x509", "-req", "-in", f"{leaf}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{leaf}.pem", "-days", "2", "-extfile", "client.ext")


class MtlsServer:
    """A server with ``--client-ca`` and one identity, ``reports``, found by the subject of
    its certificate and allowed only ``lock`` under ``reports/`` (no store, no admin)."""

    def __init__(self, d: Path) -> None:
        self.dir = d
        _certs(d)  # the server's CA (ca.pem) and certificate (cert.pem, key.pem)
        _client_ca(d, "clients-ca")
        _client_ca(d, "rogue-ca")
        _client_cert(d, "clients-ca", "reports", "/O=Acme/CN=reports")
        _client_cert(d, "clients-ca", "stranger", "/O=Acme/CN=stranger")  # the right CA, no identity
        _client_cert(d, "rogue-ca", "rogue", "/O=Acme/CN=reports")  # the right subject, another CA
        (d / "identities.toml").write_text(
            '[[identity]]\nname = "reports"\ncert_subject = "CN=reports,O=Acme"\n'
            'allow = [{ prefix = "reports/", ops = ["lock"] }]\n')
        self.server = Server(["--tls-cert", str(d / "cert.pem"), "--tls-key", str(d / "key.pem"),
                              "--client-ca", str(d / "clients-ca.pem"),
                              "--identities-file", str(d / "identities.toml")], scheme="https")
        self.url = self.server.url
        self.ca = str(d / "ca.pem")

    def pair(self, leaf: str) -> dict:
        return {"client_cert": str(self.dir / f"{leaf}.pem"), "client_key": str(self.dir / f"{leaf}.key")}


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsServer]:
    if shutil.which("openssl") is None:
        missing("openssl is needed to make the test's certificates")
    s = MtlsServer(tmp_path_factory.mktemp("mtls"))
    yield s
    s.server.stop()


@pytest.fixture
def no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("FENCED_CLIENT_CERT", "FENCED_CLIENT_KEY", "FENCED_AUTH_TOKEN", "FENCED_CA_FILE"):
        monkeypatch.delenv(v, raising=False)


def test_a_client_certificate_is_the_identity_of_its_subject(mtls: MtlsServer, name: str, no_client_env: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    mine = f"reports/{name}"
    c = fenced.Client(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **mtls.pair("reports"))
    with c.lock(mine, ttl=0.6) as lock:
        assert lock.token >= 1
        time.sleep(1.0)
        assert lock.is_valid(), f"keepalives go out with the certificate too: {lock.lost_reason}"
    first = lock.token
    # FENCED_CLIENT_CERT and FENCED_CLIENT_KEY, when the arguments are not given.
    monkeypatch.setenv("FENCED_CLIENT_CERT", mtls.pair("reports")["client_cert"])
    monkeypatch.setenv("FENCED_CLIENT_KEY", mtls.pair("reports")["client_key"])
    by_env = fenced.Client(mtls.url, ca_file=mtls.ca, request_timeout=5.0)
    second = by_env.try_lock(mine, ttl=5.0)
    assert second.token > first
    second.release()


def test_a_client_certificate_gets_its_rights_and_no_more(mtls: MtlsServer, name: str, no_client_env: None) -> None:
    c = fenced.Client(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **mtls.pair("reports"))
    before = c.try_lock(f"reports/{name}/a", ttl=5.0)
    # Outside its prefix, and an operation it was not given inside it: 403, and nothing issued.
    with pytest.raises(fenced.Forbidden) as e:
        c.try_lock(f"orders/{name}", ttl=5.0)
    assert e.value.status == 403 and e.value.details.get("identity") == "reports"
    assert e.value.details.get("name") == f"orders/{name}"
    with pytest.raises(fenced.Forbidden):
        c.store.put(f"reports/{name}/a", b"v", token=before.token)
    with pytest.raises(fenced.Forbidden):
        c.store.get(f"reports/{name}/a")
    # The server's tokens come from one counter: had the refused acquire been granted, the
    # next grant would be two above, not one.
    after = c.try_lock(f"reports/{name}/b", ttl=5.0)
    assert after.token == before.token + 1, (before.token, after.token)
    before.release()
    after.release()


def test_no_certificate_or_an_unknown_subject_is_unauthenticated(mtls: MtlsServer, name: str,
                                                                 no_client_env: None) -> None:
    for kw in ({}, mtls.pair("stranger")):
        c = fenced.Client(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **kw)
        with pytest.raises(fenced.Unauthorized) as e:
            c.try_lock(f"reports/{name}", ttl=5.0)
        assert type(e.value) is fenced.Unauthorized, f"{kw}: not 401 but {e.value!r}"
        assert e.value.status == 401 and e.value.code == "unauthorized"


def test_a_certificate_of_another_ca_gets_no_tls_session(mtls: MtlsServer, name: str, no_client_env: None) -> None:
    c = fenced.Client(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **mtls.pair("rogue"))
    started = time.monotonic()
    with pytest.raises(fenced.Transport) as e:
        c.try_lock(f"reports/{name}", ttl=5.0)
    # The server answers the handshake with a TLS alert (unknown CA), before any HTTP: no
    # 401, the request never taken, and no retrying until the time-out.
    assert not isinstance(e.value, fenced.Unauthorized)
    assert e.value.code == "tls_refused" and e.value.sent is False, repr(e.value)
    assert "ALERT_UNKNOWN_CA" in e.value.message, e.value.message
    assert time.monotonic() - started < 2.0
    # The right certificate still takes the lock: the refused one left nothing behind.
    good = fenced.Client(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **mtls.pair("reports"))
    good.try_lock(f"reports/{name}", ttl=5.0).release()


def test_the_async_client_presents_its_certificate(mtls: MtlsServer, name: str, no_client_env: None) -> None:
    async def main() -> None:
        async with fenced.AsyncClient(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **mtls.pair("reports")) as c:
            async with c.lock(f"reports/{name}", ttl=5.0) as lock:
                assert lock.token >= 1
            with pytest.raises(fenced.Forbidden):
                await c.try_lock(f"orders/{name}", ttl=5.0)
        async with fenced.AsyncClient(mtls.url, ca_file=mtls.ca, request_timeout=5.0) as nobody:
            with pytest.raises(fenced.Unauthorized) as e:
                await nobody.try_lock(f"reports/{name}", ttl=5.0)
            assert type(e.value) is fenced.Unauthorized and e.value.status == 401
        async with fenced.AsyncClient(mtls.url, ca_file=mtls.ca, request_timeout=5.0, **mtls.pair("rogue")) as rogue:
            with pytest.raises(fenced.Transport) as t:
                await rogue.try_lock(f"reports/{name}", ttl=5.0)
            assert t.value.code == "tls_refused" and t.value.sent is False, repr(t.value)

    asyncio.run(asyncio.wait_for(main(), timeout=30))


def test_a_client_certificate_needs_its_key(mtls: MtlsServer, server: Server, name: str, no_client_env: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    good = mtls.pair("reports")
    for make in (fenced.Client, fenced.AsyncClient):
        for kw in ({"client_cert": good["client_cert"]}, {"client_key": good["client_key"]}):
            with pytest.raises(ValueError, match="client_cert and client_key go together"):
                make(mtls.url, ca_file=mtls.ca, **kw)
        with pytest.raises(fenced.ConfigError, match="not the certificate's"):
            make(mtls.url, ca_file=mtls.ca, client_cert=good["client_cert"], client_key=mtls.pair("rogue")["client_key"])
        with pytest.raises(fenced.ConfigError, match="no such file"):
            make(mtls.url, ca_file=mtls.ca, client_cert=str(mtls.dir / "absent.pem"), client_key=good["client_key"])
    monkeypatch.setenv("FENCED_CLIENT_CERT", good["client_cert"])
    with pytest.raises(fenced.ConfigError, match="FENCED_CLIENT_CERT and FENCED_CLIENT_KEY go together") as e:
        fenced.Client(mtls.url, ca_file=mtls.ca)
    assert isinstance(e.value, fenced.BadRequest) and e.value.status is None
    monkeypatch.delenv("FENCED_CLIENT_CERT")
    # On http:// there is no handshake: the pair is checked, never sent, and the open
    # server serves the call as it would without it (as the Rust client does).
    plain = fenced.Client(server.url, **good)
    plain.try_lock(name, ttl=5.0).release()
