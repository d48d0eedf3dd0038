"""Emulated hosts for tests: N network namespaces on one bridge, each with its
own IPv4 address, so that a coordinator and workers talk over a network
rather than one loopback.

    with Hosts(4) as hosts:
        a, b = hosts[0], hosts[1]
        p = a.popen([...])                 # a process on host a
        hosts.limit_egress(b, 8)           # b sends at 8 Mbit/s (tc tbf)
        hosts.cut(a, b); hosts.heal(a, b)  # a's packets to b dropped, then not

Layout: every host is a namespace `slh<pid>h<i>` whose eth0 (one end of a
veth pair) holds 10.<x>.<y>.<i+1>/24; the other ends sit on a bridge in a
namespace of its own, `slh<pid>s` (the switch). Nothing of it is in the root
namespace, so nothing is routed to or from the machine's own networks: a host
reaches the other hosts and nothing else.

Cuts are one-way: cut(a, b) drops, in a's namespace, every packet a sends to
b (iptables OUTPUT). b's packets still reach a, but a TCP connection between
them cannot be made or kept in either direction (a's half of it is lost),
which is what a one-way link failure does to TCP. There is no delay: this
kernel has no netem, only tbf's rate limit.

Cleanup: the namespaces (and with them the veths, the bridge, the qdiscs and
the iptables rules, which live in them) are deleted and the processes started
on the hosts killed at close(), at exit, and on SIGTERM/SIGINT. A run killed
with SIGKILL leaves them; the next Hosts() removes every `slh<pid>*` whose
pid is gone. Needs root and iproute2; Hosts.available() says why not.
"""
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys

_PREFIX = "slh"
_live = []  # Hosts not yet closed, for atexit and the signal handlers


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete(ns):
    """Kills what still runs in `ns`, then deletes it (a namespace lives on
    while a process is in it)."""
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", ns, check=False)


def sweep():
    """Deletes the namespaces of runs whose process is gone."""
    for ns in _namespaces():
        m = re.fullmatch(_PREFIX + r"(\d+)[hs]\d*", ns)
        if m and not _alive(int(m.group(1))):
            _delete(ns)


def _iptables():
    """The iptables that works inside a namespace here (nft or legacy)."""
    for cmd in ("iptables", "iptables-legacy"):
        path = shutil.which(cmd)
        if path and subprocess.run([path, "-w", "-S"], capture_output=True).returncode == 0:
            return path
    return None


def available():
    """None where emulated hosts can be built, else why not (one line)."""
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "emulated hosts need iproute2 (ip, tc)"
    r = _ip("netns", "list", check=False)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    if _iptables() is None:
        return "emulated hosts need a working iptables"
    return None


class Host:
    def __init__(self, hosts, index, name, ns, address):
        self._hosts = hosts
        self.index = index
        self.name = name        # what a worker registers as --host
        self.ns = ns            # its network namespace
        self.address = address  # its IPv4 address on the bridge

    def argv(self, argv):
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(self, argv, **kwargs):
        """A process on this host, killed when the hosts close."""
        p = subprocess.Popen(self.argv(argv), **kwargs)
        self._hosts._procs.append(p)
        return p

    def run(self, argv, timeout=60, **kwargs):
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(argv), timeout=timeout, **kwargs)

    def __repr__(self):
        return f"Host({self.name}, {self.address})"


class Hosts:
    """N emulated hosts (see the module's doc). Index or iterate for Host."""

    def __init__(self, n, names=None):
        why = available()
        if why:
            raise RuntimeError(why)
        sweep()
        pid = os.getpid()
        self._procs = []
        self._closed = False
        self.iptables = _iptables()
        self.switch = f"{_PREFIX}{pid}s"
        # A /24 of 10.0.0.0/8 of this run's own: the namespaces have their own
        # routing tables, so it cannot clash with the machine's, and two runs
        # at once differ by pid.
        net = f"10.{100 + pid % 100}.{(pid // 100) % 256}"
        self.hosts = []
        _live.append(self)
        _install_handlers()
        try:
            _ip("netns", "add", self.switch)
            self._exec(self.switch, "ip", "link", "add", "br0", "type", "bridge")
            self._exec(self.switch, "ip", "link", "set", "br0", "up")
            for i in range(n):
                ns = f"{_PREFIX}{pid}h{i}"
                outer, inner = f"sl{pid}x{i}", f"sl{pid}y{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "netns", self.switch)
                self._exec(self.switch, "ip", "link", "set", outer, "master", "br0")
                self._exec(self.switch, "ip", "link", "set", outer, "up")
                address = f"{net}.{i + 1}"
                self._exec(ns, "ip", "link", "set", inner, "name", "eth0")
                self._exec(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
                self._exec(ns, "ip", "link", "set", "eth0", "up")
                self._exec(ns, "ip", "link", "set", "lo", "up")
                name = names[i] if names else f"host-{chr(ord('a') + i)}"
                self.hosts.append(Host(self, i, name, ns, address))
        except BaseException:
            self.close()
            raise

    def _exec(self, ns, *argv):
        r = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"in {ns}: {' '.join(argv)}: {r.stderr.strip()}")
        return r

    def __getitem__(self, i):
        return self.hosts[i]

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self):
        return len(self.hosts)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def limit_egress(self, host, mbit):
        """What `host` sends leaves at `mbit` Mbit/s (tbf; no added delay)."""
        # burst: at least one rate-second / HZ and a few MTUs; latency bounds the queue.
        self._exec(host.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{mbit}mbit",
                   "burst", "32kbit", "latency", "400ms")

    def unlimit(self, host):
        self._exec(host.ns, "tc", "qdisc", "del", "dev", "eth0", "root")

    def cut(self, a, b):
        """Drops every packet `a` sends to `b` (b's still reach a)."""
        self._exec(a.ns, self.iptables, "-w", "-A", "OUTPUT", "-d", b.address, "-j", "DROP")

    def heal(self, a, b):
        self._exec(a.ns, self.iptables, "-w", "-D", "OUTPUT", "-d", b.address, "-j", "DROP")

    def close(self):
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        # Every namespace of this run, also those of hosts whose creation
        # failed half way (they have no Host yet).
        for ns in _namespaces():
            if re.fullmatch(f"{_PREFIX}{os.getpid()}" + r"[hs]\d*", ns):
                _delete(ns)
        if self in _live:
            _live.remove(self)


def _close_all():
    for h in list(_live):
        h.close()


_handlers_installed = False


def _install_handlers():
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_close_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            _close_all()
            if callable(previous):
                previous(signum, frame)
            else:
                sys.exit(128 + signum)

        signal.signal(sig, handler)
