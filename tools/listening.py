"""The TCP sockets listening in this network namespace, from /proc/net/tcp and tcp6 (no dependency):

    python3 tools/listening.py > before.txt      # one "address:port" per line, sorted
    make test
    python3 tools/listening.py --new-since before.txt   # exits 1, listing them, if any socket is new

.ci/run does this around the whole test run: a daemon that a package's install started (sshd on port 22), or a
process a test left behind, would still be listening at the end.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

LISTEN = "0A"  # the kernel's TCP_LISTEN, as /proc/net/tcp writes the state


def address(hex_address: str) -> str:
    """/proc/net/tcp's "0100007F:1F90" as "127.0.0.1:8080" (IPv6's four little-endian words likewise)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{ipaddress.ip_address(raw)}:{int(port, 16)}"


def listening() -> list[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                found.add(address(fields[1]))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-since", metavar="FILE", help="exit 1 naming the sockets not listed in FILE")
    args = parser.parse_args(argv)
    now = listening()
    if args.new_since is None:
        print("\n".join(now))
        return 0
    before = set(Path(args.new_since).read_text().split())
    new = [socket for socket in now if socket not in before]
    if new:
        print(f"listening now, and not before the tests ({args.new_since}): {', '.join(new)}. Fix: find the "
              "process (`ss -ltnp`), and make the test or the install that started it stop it", file=sys.stderr)
        return 1
    print(f"no new listening socket ({len(now)} as before)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
