#!/usr/bin/env python3
"""A network between namespaces, in userspace, with delay and loss: `tc netem` for kernels
that lack the sch_netem qdisc (scripts/netns-cluster.sh uses it there).

Every node gets a TUN interface with its own address (10.77.0.N/24); this process is the wire
between them: it reads each IPv4 packet a node sends, drops it with probability LOSS, and
otherwise delivers it to the interface that owns its destination address DELAY_MS later (per
packet and per direction, like netem on each node's egress: the round trip is twice DELAY_MS).
TCP runs unchanged on top and sees the delay and the losses, retransmissions included.

    wire.py --delay-ms 0.5 --loss 0.01 --tag pw123 NAMESPACE=10.77.0.2 ... [host=10.77.0.1]

A node in namespace `host` is on the calling namespace (the host). Prints "wire ready" once every interface
is up, then forwards until killed (SIGTERM); it then prints what it carried and dropped.
Run as root.
"""

import argparse
import fcntl
import heapq
import ipaddress
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MTU = 65000


def sh(*cmd):
    subprocess.run(cmd, check=True)


def attach(ifname, ns, addr):
    """Creates a TUN interface, opens it, moves it into namespace `ns` (the open descriptor
    stays bound to it) and gives it `addr`/24."""
    sh("ip", "tuntap", "add", "dev", ifname, "mode", "tun")
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    ip = ["ip"] if ns == "host" else ["ip", "-n", ns]
    if ns != "host":
        sh("ip", "link", "set", ifname, "netns", ns)
    sh(*ip, "addr", "add", f"{addr}/24", "dev", ifname)
    sh(*ip, "link", "set", ifname, "mtu", str(MTU), "up")
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per packet")
    ap.add_argument("--loss", type=float, default=0.0, help="fraction of packets dropped, 0..1")
    ap.add_argument("--tag", required=True, help="interface name prefix (unique per run)")
    ap.add_argument("nodes", nargs="+", help="NAMESPACE=ADDRESS (NAMESPACE host: this one)")
    a = ap.parse_args()
    if not 0.0 <= a.loss < 1.0 or a.delay_ms < 0:
        sys.exit("wire.py: --loss must be in [0, 1) and --delay-ms >= 0")

    by_addr = {}
    fds = []
    try:
        for i, node in enumerate(a.nodes):
            ns, addr = node.split("=", 1)
            fd = attach(f"{a.tag}t{i}", ns, str(ipaddress.IPv4Address(addr)))
            by_addr[ipaddress.IPv4Address(addr).packed] = fd
            fds.append(fd)
    except (subprocess.CalledProcessError, OSError, ValueError) as e:
        sys.exit(f"wire.py: setting up the interfaces failed: {e}")

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print("wire ready", flush=True)

    delay = a.delay_ms / 1000.0
    rng = random.Random()
    queue = []  # (due, seq, fd, packet)
    seq = 0
    carried = dropped = 0
    while not stop:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, fd, pkt = heapq.heappop(queue)
            try:
                os.write(fd, pkt)
            except OSError:
                dropped += 1  # the receiving interface is full or gone: a loss, as on a wire
        timeout = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        for fd in ready:
            while True:
                try:
                    pkt = os.read(fd, MTU + 64)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if len(pkt) < 20 or pkt[0] >> 4 != 4:
                    continue  # IPv4 only (the nodes' IPv6 chatter goes nowhere)
                out = by_addr.get(pkt[16:20])
                if out is None:
                    continue
                if a.loss and rng.random() < a.loss:
                    dropped += 1
                    continue
                carried += 1
                if delay == 0:
                    try:
                        os.write(out, pkt)
                    except OSError:
                        dropped += 1
                else:
                    seq += 1
                    heapq.heappush(queue, (time.monotonic() + delay, seq, out, pkt))
    print(f"wire: carried {carried} packets, dropped {dropped}", flush=True)


if __name__ == "__main__":
    main()
