#!/usr/bin/env python3
"""The readiness protocol deploy/systemd/fenced.service relies on, on the real binary.

    deploy/check-notify.py [FENCED_BIN]      # or FENCED_BIN=... deploy/check-notify.py
    deploy/check-notify.py --self-test       # only the negative controls

Plays systemd's part of Type=notify without systemd: binds a datagram socket, starts
the server with NOTIFY_SOCKET pointing at it (a single server on a free loopback port,
temporary data directory), and checks that
  - READY=1 arrives, and GET /readyz answers 200 at that moment (the unit's start is
    over only once the server serves);
  - SIGHUP (the unit's ExecReload) leaves the server running and ready, and it logs
    that the identities were reloaded;
  - SIGTERM (KillSignal) sends STOPPING=1, and the process exits with status 0 well
    within the unit's TimeoutStopSec (a non-zero status would make Restart=on-failure
    restart a server that was told to stop).
The negative controls run first, every time: stand-ins that never notify, notify
before they serve, or never say STOPPING=1 must each be reported. Every process is
killed and the temporary directory removed on every path; the run is bounded.

Standard library only (CI's python3).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from checklib import Failure, free_ports, run

DEADLINE_S = 30.0
START = time.monotonic()
STOP_WITHIN_S = 20.0  # the unit's TimeoutStopSec is 30 s


def free_port():
    return free_ports(1)[0]


def readyz(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def recv_state(sock, within, proc, what):
    """The next notification's KEY=VALUE pairs, within `within` seconds."""
    end = time.monotonic() + within
    while True:
        t = min(end, START + DEADLINE_S) - time.monotonic()
        if t <= 0:
            raise Failure(f"no {what} within {within:.1f}s")
        sock.settimeout(min(t, 0.2))
        try:
            data = sock.recv(4096)
        except socket.timeout:
            if proc.poll() is not None:
                raise Failure(f"exited with {proc.returncode} before {what}")
            continue
        return dict(l.split("=", 1) for l in data.decode().splitlines() if "=" in l)


def check(cmd, work, port, log_path, ready_within=10.0, reload_log=True):
    """Runs `cmd` under a notify socket of ours; raises Failure on the first gap."""
    path = os.path.join(work, "notify.sock")
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            env={**{k: v for k, v in os.environ.items() if not k.startswith("FENCED_")},
                                 "NOTIFY_SOCKET": path, "FENCED_LOG": "info"})
    log.close()
    try:
        t0 = time.monotonic()
        state = recv_state(sock, ready_within, proc, "READY=1")
        if state.get("READY") != "1":
            raise Failure(f"first notification is {state}, not READY=1")
        st = readyz(port)
        if st != 200:
            raise Failure(f"READY=1 sent, but GET /readyz answers {st} at that moment")
        ready_s = time.monotonic() - t0

        proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        if proc.poll() is not None:
            raise Failure(f"SIGHUP (ExecReload) ended the server: status {proc.returncode}")
        if readyz(port) != 200:
            raise Failure("not ready after SIGHUP")
        if reload_log:
            with open(log_path, "rb") as f:
                if b"identities reloaded" not in f.read():
                    raise Failure("SIGHUP did not reload the identities (no 'identities reloaded' logged)")

        proc.send_signal(signal.SIGTERM)
        t1 = time.monotonic()
        state = recv_state(sock, 5.0, proc, "STOPPING=1 after SIGTERM")
        if state.get("STOPPING") != "1":
            raise Failure(f"notification after SIGTERM is {state}, not STOPPING=1")
        try:
            rc = proc.wait(timeout=max(0.1, min(STOP_WITHIN_S, START + DEADLINE_S - time.monotonic())))
        except subprocess.TimeoutExpired:
            raise Failure(f"still running {STOP_WITHIN_S:.0f}s after SIGTERM")
        if rc != 0:
            raise Failure(f"exit status {rc} after SIGTERM (Restart=on-failure would restart it)")
        return ready_s, time.monotonic() - t1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


# Stand-ins for a server that gets the protocol wrong; each must be reported.
SERVE = ("import http.server, threading, sys\n"
         "class H(http.server.BaseHTTPRequestHandler):\n"
         "    def do_GET(self):\n"
         "        self.send_response(200); self.end_headers(); self.wfile.write(b'{}')\n"
         "    def log_message(self, *a): pass\n"
         "srv = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
         "threading.Thread(target=srv.serve_forever, daemon=True).start()\n")
NOTIFY = ("import os, socket\n"
          "def notify(s):\n"
          "    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(s, os.environ['NOTIFY_SOCKET'])\n")
FAKES = {
    "never notifies": (SERVE + "import time; time.sleep(30)\n", "no READY=1"),
    "notifies before it serves": (NOTIFY + "import time\nnotify(b'READY=1')\ntime.sleep(30)\n",
                                  "GET /readyz answers None"),
    "never says STOPPING=1": (SERVE + NOTIFY + "import signal, time\n"
                              "signal.signal(signal.SIGHUP, lambda *a: None)\n"
                              "signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
                              "notify(b'READY=1')\ntime.sleep(30)\n",
                              "before STOPPING=1"),
    "exits 1 on SIGTERM": (SERVE + NOTIFY + "import signal, time\n"
                           "signal.signal(signal.SIGHUP, lambda *a: None)\n"
                           "signal.signal(signal.SIGTERM, lambda *a: (notify(b'STOPPING=1'), os._exit(1)))\n"
                           "notify(b'READY=1')\ntime.sleep(30)\n", "exit status 1"),
}


def self_test(work):
    for name, (code, want) in FAKES.items():
        port = free_port()
        try:
            check([sys.executable, "-c", code, str(port)], work, port, os.path.join(work, "fake.log"),
                  ready_within=1.5, reload_log=False)
        except Failure as e:
            if want not in str(e):
                raise Failure(f"self-test: a stand-in that {name} was reported as {e!r}, not {want!r}")
        else:
            raise Failure(f"self-test: a stand-in that {name} passed the check")
    print(f"self-test: ok ({len(FAKES)} stand-ins that get readiness wrong reported)")


def terminated(signum, frame):
    raise Failure("terminated")


def main(argv):
    # Stopped from outside (CI's timeout): still kill the server and remove the directory.
    signal.signal(signal.SIGTERM, terminated)
    args = argv[1:]
    work = tempfile.mkdtemp(prefix="fenced-check-notify.")
    try:
        self_test(work)
        if args[:1] == ["--self-test"]:
            return 0
        binary = args[0] if args else os.environ.get("FENCED_BIN")
        if not binary:
            raise Failure("usage: check-notify.py FENCED_BIN (or set FENCED_BIN)")
        binary = os.path.abspath(binary)
        port = free_port()
        cmd = [binary, "server", "--data-dir", os.path.join(work, "data"), "--listen", f"127.0.0.1:{port}"]
        log_path = os.path.join(work, "server.log")
        try:
            ready_s, stop_s = check(cmd, work, port, log_path)
        except Failure as e:
            with open(log_path, "rb") as f:
                raise Failure(f"{e}\n--- server log ---\n{f.read().decode(errors='replace')[-2000:]}")
        print(f"ok: READY=1 after {ready_s:.2f}s with /readyz 200, SIGHUP reloaded, "
              f"STOPPING=1 and exit 0 {stop_s:.2f}s after SIGTERM")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    run(main)
