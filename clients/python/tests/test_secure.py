"""Bearer tokens and TLS against a server that requires them."""

from __future__ import annotations

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


def _certs(d: Path) -> None:
    """A CA and a leaf for 127.0.0.1 signed by it, with openssl."""
    def run(*args: str) -> None:
        out = subprocess.run(["openssl", *args], cwd=d, capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode(errors="replace")

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=fenced test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                           "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
                           "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "cert.pem", "-days", "2", "-extfile", "ext")


def test_https_with_the_servers_ca(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

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
