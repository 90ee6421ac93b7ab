"""What the deploy checks share: their failure, free loopback ports, and how a check's
main runs (exit 1 with ``FAIL`` and the reason on a :class:`Failure`). Standard library
only; imported from beside them (``deploy/`` is the scripts' own directory)."""

import socket
import sys


class Failure(Exception):
    pass


def free_ports(n):
    """``n`` distinct loopback ports free now (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run(main):
    """Exits with ``main(sys.argv)``'s code, or 1 after printing ``FAIL`` and the reason
    of a :class:`Failure`."""
    try:
        sys.exit(main(sys.argv))
    except Failure as e:
        print(f"FAIL {e}", file=sys.stderr)
        sys.exit(1)
