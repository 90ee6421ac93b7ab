"""The client refuses, with a clear error, an endpoint that does not speak API v1."""

from __future__ import annotations

import json

import pytest

import fenced
from support import FakeMember, Server, http_get


def test_a_fenced_server_passes_and_its_version_is_known(server: Server, name: str) -> None:
    c = fenced.Client(server.url)
    c.try_lock(name).release()
    assert c.server_version() == "0.1.0"


def test_a_server_without_the_api_document_is_refused() -> None:
    other = FakeMember(None, 404, {"code": "not_found", "message": "no such route"})
    try:
        with pytest.raises(fenced.UnsupportedServer, match="no /openapi.json"):
            fenced.Client(other.url).try_lock("x")
        assert not any("/v1/" in h for h in other.hits), "nothing was sent to /v1 before the check"
    finally:
        other.close()


def test_a_server_lacking_a_v1_route_is_refused(server: Server) -> None:
    doc = json.loads(http_get(server.url + "/openapi.json")[1])
    del doc["paths"]["/v1/leases/{lease_id}/keepalive"]
    doc["info"]["version"] = "9.0.0"
    other = FakeMember(json.dumps(doc).encode())
    try:
        with pytest.raises(fenced.UnsupportedServer) as e:
            fenced.Client(other.url).try_lock("x")
        assert "9.0.0" in str(e.value) and "POST /v1/leases/{lease_id}/keepalive" in str(e.value)
    finally:
        other.close()


def test_another_api_document_is_refused() -> None:
    other = FakeMember(json.dumps({"openapi": "3.1.0", "info": {"title": "Petstore", "version": "1"}}).encode())
    try:
        with pytest.raises(fenced.UnsupportedServer, match="not Fenced's"):
            fenced.Client(other.url).store.get("k")
    finally:
        other.close()
