"""Loopback helpers for tests that start servers."""

import random
import socket

# Below the kernel's ephemeral range (32768-60999 by default): a port the kernel hands out for
# bind(0) can be taken by any outgoing connection (a Spark worker's, a JVM's) between the pick
# and the server's own bind, which failed a clean-clone CI run once ("port ... already in use").
_LOW, _HIGH = 20000, 32000
_handed: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range, never handed out twice."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(_LOW, _HIGH)
        if port in _handed:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_LOW}-{_HIGH}")


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
