#!/usr/bin/env python3
"""Emulated hosts for tests: N network namespaces on one bridge, each with its
own IPv4 address, so that a coordinator and workers talk over a network
rather than one loopback.

    with Hosts(4) as hosts:                # or Hosts(4, names=[...]); hosts[i], len, iter
        a, b = hosts[0], hosts[1]
        p = a.popen([...], stdout=...)     # a process on host a (a Popen), killed at close
        r = b.run([...], timeout=30)       # run on host b to completion (a CompletedProcess)
        a.address, a.name                  # "10.x.y.1", "host-a"
        hosts.limit_egress(b, 8)           # b sends at 8 Mbit/s (tc tbf); hosts.unlimit(b)
        hosts.cut(a, b); hosts.heal(a, b)  # a's packets to b dropped, then not

Layout. Every host is a namespace `slh<pid>h<i>` whose eth0 (one end of a
veth pair) holds <subnet>.<i+1>/24. The other ends (`sl<pid>p<i>`) sit on a
bridge br0 in a namespace of its own, `slh<pid>s` (the switch), not in the
root namespace (a process's k-th Hosts at once, k > 0, is `slh<pid>i<k>...`):
the root namespace gets no interface, address, route or rule, so nothing is
routed to or from the machine's own networks, the machine's firewall (a
FORWARD policy of DROP, br_netfilter) cannot touch the hosts' traffic, and
killing a run cannot leave a bridge behind in the root namespace. The veths
are created directly in their namespaces (`ip link add ... netns`), so they
never appear in the root namespace even for an instant. A host has only its
/24 (no default route, IPv4 forwarding off, no IPv6 on eth0): it reaches the
other hosts and nothing else.

Subnet. A /24 of 10.128.0.0/9 picked from the pid (two runs at once differ),
skipping any that overlaps a route or address of the root namespace or
the hosts of any live Hosts. Each run has its own switch, so even equal subnets
could not meet; the check keeps addresses unambiguous in logs.

Cuts are one-way: cut(a, b) drops every IPv4 packet from a to b, on arrival
in b's namespace (`iptables -I INPUT -s <a> -j DROP` there). a's packets
still leave a (a's sends succeed and spend a's egress rate, as on a real
lossy link; a rule in a's OUTPUT chain would instead fail a's sends locally
with EPERM, which no real network does). b's packets still reach a. TCP
needs both directions, so while a -> b is cut no TCP connection between
them can be made or kept either way: a's SYNs to b are lost, and so are
a's SYN-ACKs to b's SYNs and a's ACKs of b's data. ARP is not filtered.
Established connections are cut too (the rule has no state match). heal(a, b)
removes that rule; cut and heal are idempotent. The iptables used is the
first of `iptables` (here 1.8 on its nf_tables backend), `iptables-nft` and
`iptables-legacy` that can add, check and delete a rule inside a scratch
namespace (`slh<pid>p`, at the first Hosts or available()). There is no
delay: this kernel has no netem, only tbf's rate limit.

Cleanup. The processes started with popen are killed (and anything else
still inside the namespaces), then the namespaces are deleted, and with
them the veths, the bridge, the qdiscs and the iptables rules, which all
live in them. It happens at close() (the `with` block's end, also on an
exception), at exit (atexit), and on SIGTERM, SIGINT and SIGHUP (then the
process exits 128+signal, or raises KeyboardInterrupt for SIGINT where that
was the handler). A run killed with SIGKILL leaves them; the next Hosts()
(or `python3 tests/hosts.py --sweep`) removes every `slh<pid>*` whose owner
is gone: its pid is dead, or alive but started at another time than the one
recorded in the switch's bridge alias (pid reuse). Needs root, iproute2 and
a working iptables; available() says why not in one line.
"""
import atexit
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

_PREFIX = "slh"
# slh<pid>[i<k>](h<i>|s|p): host i, the switch, the iptables probe; i<k> for
# the k-th Hosts of a process (k > 0), so that one process may hold several.
_NS = re.compile(_PREFIX + r"(\d+)(?:i\d+)?([hsp])(\d*)")
_LINK = re.compile(r"sl(\d+)[xy]\d+")  # root-namespace veths of earlier versions of this file
_live = []  # Hosts not yet closed, for atexit and the signal handlers
_made = 0   # Hosts made by this process
_iptables_cmd = None


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _start_time(pid):
    """The process's start time in clock ticks since boot (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(pid, namespaces):
    """Whether the run of `pid` still owns its namespaces: its pid is alive
    and, where a switch of it recorded a start time, it is that process."""
    start = _start_time(pid)
    if start is None:
        return False
    for ns in namespaces:
        m = _NS.fullmatch(ns)
        if m and int(m.group(1)) == pid and m.group(2) == "s":
            r = _ip("-n", ns, "-o", "link", "show", "br0", check=False)
            a = re.search(r"alias slh:(\d+):(\d+)", r.stdout)
            if a:
                return a.group(2) == start
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
    """Deletes the namespaces (and root-namespace links of older versions)
    of runs whose owner is gone. Returns the names it removed."""
    removed = []
    owners = {}
    namespaces = _namespaces()
    for ns in namespaces:
        m = _NS.fullmatch(ns)
        if not m:
            continue
        pid = int(m.group(1))
        if pid not in owners:
            owners[pid] = pid != os.getpid() and not _owner_alive(pid, namespaces)
        if owners[pid]:
            _delete(ns)
            removed.append(ns)
    for link in _root_links():
        m = _LINK.fullmatch(link)
        if m and _start_time(int(m.group(1))) is None:
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def leftovers(pid=None):
    """Namespaces and root-namespace links of this module's naming (of run
    `pid` only, if given) that exist now."""
    found = []
    for name in _namespaces() + _root_links():
        m = _NS.fullmatch(name) or _LINK.fullmatch(name)
        if m and (pid is None or int(m.group(1)) == pid):
            found.append(name)
    return found


def _root_links():
    r = _ip("-o", "link", "show", check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in r.stdout.splitlines() if ":" in line]


def _iptables():
    """The iptables that can add and delete a rule in a namespace here: nft
    first (the distribution's `iptables`), then legacy. None if neither."""
    global _iptables_cmd
    if _iptables_cmd is not None:
        return _iptables_cmd or None
    _iptables_cmd = ""
    probe = f"{_PREFIX}{os.getpid()}p"
    if _ip("netns", "add", probe, check=False).returncode != 0:
        return None
    try:
        for cmd in ("iptables", "iptables-nft", "iptables-legacy"):
            path = shutil.which(cmd)
            if not path:
                continue
            rule = ["INPUT", "-s", "192.0.2.255", "-j", "DROP"]  # TEST-NET-1, never used
            ok = all(subprocess.run(["ip", "netns", "exec", probe, path, "-w", op, *rule],
                                    capture_output=True, timeout=30).returncode == 0 for op in ("-A", "-C", "-D"))
            if ok:
                _iptables_cmd = path
                break
    finally:
        _ip("netns", "del", probe, check=False)
    return _iptables_cmd or None


def available():
    """None where emulated hosts can be built, else why not (one line)."""
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns, veth, bridge, tc, iptables); run the test as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated hosts need iproute2 ('{tool}' is not on PATH)"
    r = _ip("netns", "list", check=False)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip() or r.returncode}"
    if _iptables() is None:
        return "emulated hosts need an iptables (nft or legacy) that can add a rule inside a network namespace"
    return None


def _routed_networks():
    """Every IPv4 network the root namespace routes or holds an address in."""
    nets = []
    for args in (("-4", "-o", "route", "show", "table", "all"), ("-4", "-o", "addr", "show")):
        for line in _ip(*args, check=False).stdout.split("\n"):
            for word in line.split():
                if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word):
                    try:
                        nets.append(ipaddress.ip_network(word, strict=False))
                    except ValueError:
                        pass
    return nets


def _taken_subnets():
    """The /24s held by the hosts of every run (and other Hosts of this one)."""
    taken = []
    for ns in _namespaces():
        m = _NS.fullmatch(ns)
        if m and m.group(2) == "h":
            out = _ip("-n", ns, "-4", "-o", "addr", "show", "dev", "eth0", check=False).stdout
            for a in re.findall(r"inet (\S+)", out):
                taken.append(ipaddress.ip_network(a, strict=False))
    return taken


def _pick_subnet(pid):
    """A /24 of 10.128.0.0/9 from the pid, skipping any that overlaps a
    route or address of the machine or another live run's subnet."""
    busy = [n for n in _routed_networks() if n.prefixlen > 0] + _taken_subnets()
    for k in range(1 << 15):
        i = (pid + k) % (1 << 15)
        net = ipaddress.ip_network(f"10.{128 + (i >> 8)}.{i & 255}.0/24")
        if not any(net.overlaps(b) for b in busy):
            return net
    raise RuntimeError("emulated hosts: no free /24 in 10.128.0.0/9")


class Host:
    def __init__(self, hosts, index, name, ns, address):
        self._hosts = hosts
        self.index = index
        self.name = name        # what a worker registers as --host
        self.ns = ns            # its network namespace
        self.address = address  # its IPv4 address on the bridge
        self.interface = "eth0"  # its one interface (in its namespace)

    def argv(self, argv):
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(self, argv, **kwargs):
        """A process on this host (subprocess.Popen's arguments); killed when
        the hosts close."""
        p = subprocess.Popen(self.argv(argv), **kwargs)
        self._hosts._procs.append(p)
        return p

    def run(self, argv, timeout=60, **kwargs):
        """subprocess.run on this host; output captured as text unless told
        otherwise. Killed at `timeout` (TimeoutExpired) or when the hosts close."""
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
        if names is not None and len(names) != n:
            raise ValueError("names: one per host")
        if n > 253:
            raise ValueError("at most 253 hosts on one /24")
        sweep()
        global _made
        self.owner = pid = os.getpid()
        self._procs = []
        self._cuts = set()
        self._limits = set()
        self._closed = False
        self.iptables = _iptables()
        self.prefix = f"{_PREFIX}{pid}" + (f"i{_made}" if _made else "")
        _made += 1
        self.switch = f"{self.prefix}s"
        self.hosts = []
        _live.append(self)
        _install_handlers()
        try:
            self.subnet = _pick_subnet(pid)
            base = self.subnet.network_address
            _ip("netns", "add", self.switch)
            self._sysctl(self.switch, "net.ipv4.ip_forward=0", "net.ipv6.conf.all.disable_ipv6=1",
                         "net.ipv6.conf.default.disable_ipv6=1", "net.bridge.bridge-nf-call-iptables=0")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            # The owner's start time, so a sweep can tell a reused pid from this run.
            _ip("-n", self.switch, "link", "set", "br0", "alias", f"slh:{pid}:{_start_time(pid)}")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i in range(n):
                ns = f"{self.prefix}h{i}"
                port = f"sl{pid}p{i}"  # its end on the bridge; <= 15 characters for any pid (<= 4194304)
                _ip("netns", "add", ns)
                self._sysctl(ns, "net.ipv4.ip_forward=0")
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
                address = str(base + i + 1)
                self._sysctl(ns, "net.ipv6.conf.eth0.disable_ipv6=1")
                _ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                name = names[i] if names else f"host-{chr(ord('a') + i)}" if i < 26 else f"host-{i}"
                self.hosts.append(Host(self, i, name, ns, address))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _sysctl(ns, *settings):
        for s in settings:
            key, value = s.split("=")
            path = "/proc/sys/" + key.replace(".", "/")
            # /proc/sys/net is the namespace of whoever opens it: write it from inside.
            subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", f"[ ! -e {path} ] || echo {value} > {path}"],
                           capture_output=True, timeout=30, check=True)

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

    def limit_egress(self, host, mbit, latency_ms=400):
        """What `host` sends leaves at `mbit` Mbit/s (10^6 bit/s): a tbf qdisc
        at the root of its eth0, replacing any earlier limit. No added delay;
        a packet waits at most `latency_ms` in the queue, then is dropped."""
        rate = float(mbit) * 1e6 / 8  # bytes/s
        # burst: the bucket, what may leave at line rate after an idle spell:
        # 5 ms at the rate, and never under 16 KiB (a few 1514-byte frames and
        # a timer tick's worth at low rates).
        burst = max(16384, int(rate * 0.005))
        self._exec(host.ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{float(mbit):g}mbit",
            "burst", str(burst), "latency", f"{latency_ms}ms")
        self._limits.add(host.ns)

    def unlimit(self, host):
        """Removes `host`'s egress limit (none: nothing to do)."""
        if "tbf" in self._exec(host.ns, "tc", "qdisc", "show", "dev", "eth0").stdout:
            self._exec(host.ns, "tc", "qdisc", "del", "dev", "eth0", "root")
        self._limits.discard(host.ns)

    def _iptables_in(self, host, op, source):
        self._exec(host.ns, self.iptables, "-w", op, "INPUT", "-s", source.address, "-j", "DROP")

    def cut(self, a, b):
        """Drops every packet `a` sends to `b`, on arrival at b (b's still
        reach a; see the module's doc for what that does to TCP)."""
        if (a.ns, b.ns) in self._cuts:
            return
        self._iptables_in(b, "-I", a)
        self._cuts.add((a.ns, b.ns))

    def heal(self, a, b):
        """Undoes cut(a, b) (not cut: nothing to do)."""
        if (a.ns, b.ns) not in self._cuts:
            return
        self._iptables_in(b, "-D", a)
        self._cuts.discard((a.ns, b.ns))

    def close(self):
        """Kills the hosts' processes and deletes every namespace of this run
        (idempotent; a forked child that inherited the object does nothing)."""
        # Not marked closed until done: a signal that lands here runs close()
        # again from its handler, which finishes the work (every step may be
        # done twice) before the process exits.
        if self._closed or os.getpid() != self.owner:
            return
        for p in self._procs:
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        # Every namespace of this run, also those of hosts whose creation
        # failed half way (they have no Host yet); the veths, bridge, qdiscs
        # and rules go with them.
        for ns in _namespaces():
            if re.fullmatch(re.escape(self.prefix) + r"[hs]\d*", ns):
                _delete(ns)
        self._closed = True
        self._cuts.clear()
        self._limits.clear()
        if self in _live:
            _live.remove(self)


def _close_all():
    for h in list(_live):
        h.close()


_handlers_installed = False


def _install_handlers():
    """atexit, and SIGTERM/SIGINT/SIGHUP handlers that close every live
    Hosts, then do what the previous handler did (or exit 128+signal).
    Signal handlers can be set only from the main thread: elsewhere, only
    atexit and the sweep."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_close_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue

        def handler(signum, frame, previous=previous):
            _close_all()
            if callable(previous):
                previous(signum, frame)
            else:
                sys.exit(128 + signum)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass


# ---- hosts to try things on, from a shell: up, run, address, down ----------
#
# `up N` starts a keeper process that makes Hosts(N) and holds them (it is
# their owner, so no sweep removes them) until `down` stops it, which closes
# them as any Hosts closes: what runs inside is killed and every namespace
# deleted. The keeper's pid and the hosts are in STATE.

STATE = os.environ.get("SHARDLINE_HOSTS_STATE", "/tmp/shardline-hosts.json")
USAGE = """usage: tests/hosts.py up N           N emulated hosts (host-a, host-b, ...) until `down`
       tests/hosts.py run HOST -- CMD   CMD on HOST (in its network namespace)
       tests/hosts.py address HOST      HOST's IPv4 address
       tests/hosts.py down              stop the hosts: kill what runs on them, remove them
       tests/hosts.py --sweep           remove what runs that are gone left behind"""


def _read_state():
    """The hosts `up` made ({"keeper": pid, "hosts": [...]}), or None where none are up."""
    try:
        with open(STATE) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if _start_time(state.get("keeper", 0)) is not None else None


def _up(n):
    if _read_state():
        sys.exit(f"hosts.py: hosts are up already ({STATE}): tests/hosts.py down first")
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:  # the keeper: its own session, no terminal, holds the hosts
        os.close(ready_r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            hosts = Hosts(n)
            state = {"keeper": os.getpid(), "hosts": [{"name": h.name, "ns": h.ns, "address": h.address}
                                                     for h in hosts]}
            with open(STATE + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(STATE + ".tmp", STATE)
            os.write(ready_w, b"ok")
        except BaseException as e:  # noqa: B902: whatever it was goes to `up`, which says it
            os.write(ready_w, f"error: {e}".encode()[:4000])
            os._exit(1)
        os.close(ready_w)
        while True:  # until `down`'s SIGTERM, whose handler closes the hosts and exits
            signal.pause()
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as r:
        said = r.read().decode()
    if said != "ok":
        sys.exit(f"hosts.py up: {said or 'the keeper died'}")
    state = _read_state()
    for h in state["hosts"]:
        print(f"{h['name']}  {h['address']:<15}  tests/hosts.py run {h['name']} -- CMD   "
              f"(ip netns exec {h['ns']} CMD)")


def _host(name):
    state = _read_state()
    if not state:
        sys.exit("hosts.py: no hosts are up: tests/hosts.py up N")
    for h in state["hosts"]:
        if h["name"] == name:
            return h
    sys.exit(f"hosts.py: no host {name!r} (up: {', '.join(h['name'] for h in state['hosts'])})")


def _down():
    state = _read_state()
    if not state:
        print("no hosts are up")
        return
    os.kill(state["keeper"], signal.SIGTERM)
    deadline = time.time() + 30
    while time.time() < deadline and _start_time(state["keeper"]) is not None:
        time.sleep(0.05)
    left = [h["ns"] for h in state["hosts"] if h["ns"] in _namespaces()]
    for ns in left:  # a keeper that could not finish: remove them here
        _delete(ns)
    try:
        os.unlink(STATE)
    except FileNotFoundError:
        pass
    print(f"removed {len(state['hosts'])} hosts")


def main(argv):
    if argv == ["--sweep"]:
        why = available()
        if why:
            sys.exit(why)
        for name in sweep():
            print("removed", name)
    elif len(argv) == 2 and argv[0] == "up" and argv[1].isdigit() and 1 <= int(argv[1]) <= 253:
        why = available()
        if why:
            sys.exit(why)
        _up(int(argv[1]))
    elif len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        ns = _host(argv[1])["ns"]
        os.execvp("ip", ["ip", "netns", "exec", ns, *argv[3:]])
    elif len(argv) == 2 and argv[0] == "address":
        print(_host(argv[1])["address"])
    elif argv == ["down"]:
        _down()
    else:
        sys.exit(USAGE)


if __name__ == "__main__":
    main(sys.argv[1:])
