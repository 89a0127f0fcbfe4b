"""The rank harness's rendezvous port is chosen where no other process is handed it by the kernel.

``_sfprobe.free_tcp_port`` picks the port the parent passes to the ranks; rank 0's TCPStore binds it
later. A port below the kernel's ephemeral range cannot be taken meanwhile by an outgoing connection
or another process's bind to port 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"))
import _sfprobe as sf  # noqa: E402  (in-image helper, not a package module)


def test_rendezvous_port_is_below_the_ephemeral_range_and_bindable():
    import socket
    low, _ = sf.ephemeral_range()
    for _ in range(20):
        port = sf.free_tcp_port()
        assert sf.RENDEZVOUS_PORTS[0] <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over():
    import socket

    class Offers:
        def __init__(self, ports):
            self.ports = list(ports)

        def randint(self, low, high):
            return self.ports.pop(0)

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = sf.free_tcp_port(rng=Offers([sf.RENDEZVOUS_PORTS[0] + 17]))
        assert free == sf.RENDEZVOUS_PORTS[0] + 17
        # a taken port offered first is skipped (the offers may exceed the range; bind decides)
        assert sf.free_tcp_port(rng=Offers([busy, free])) == free
