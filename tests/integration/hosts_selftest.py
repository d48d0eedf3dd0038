"""tests/hosts.py holds what the emulated-host tests (e2e_multihost,
e2e_partitions) build on:

1. Hosts on one bridge, each with its own address in a /24 of the run's own
   that the machine does not route; the root namespace gets no link, route
   or address; a host has no route but its /24.
2. Two hosts reach each other over TCP both ways (python sockets run on the
   hosts); a host cannot reach the machine's own address nor one outside the
   subnet (no route: ENETUNREACH), nor did anything leave toward them.
3. cut(a, b) is one-way: a's datagrams to b are lost (and a's sends succeed,
   as on a real lossy link) while b's to a arrive; no TCP connection can be
   made between a and b either way (TCP needs both directions), while c still
   reaches b; heal(a, b) restores all of it and leaves no rule.
4. limit_egress(a, 8): a 2 MB transfer from a takes at least 1.5 s at the
   receiver (the bound is explained where it is checked); b's transfer to a
   is not limited; unlimit removes the qdisc.
5. close() kills what ran on the hosts (also a grandchild) and leaves no
   namespace or link of the run.
6. A run killed by SIGTERM, SIGINT or SIGHUP cleans up itself (nothing of
   its pid left, its host processes gone); one killed by SIGKILL leaves its
   namespaces, and the sweep removes them and kills what ran in them.
Exits 77 (skipped) where emulated hosts cannot be built (not root, no ip
netns, no usable iptables)."""
import errno
import ipaddress
import json
import os
import select
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import hosts as emulated  # noqa: E402
from harness import Checks, scratch_dir  # noqa: E402

PY = sys.executable
PORT = 5201  # every host has its own port space

# A TCP sink: accepts one connection, reads to EOF, answers with a JSON line
# {"bytes", "seconds" (first byte to EOF)}, and prints the same.
SINK = r"""
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4); s.settimeout(float(sys.argv[3]))
print("ready", flush=True)
try:
    c, _ = s.accept()
except socket.timeout:
    print(json.dumps({"accepted": False})); sys.exit(0)
c.settimeout(30); n = 0; first = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    if first is None: first = time.monotonic()
    n += len(b)
r = {"accepted": True, "bytes": n, "seconds": time.monotonic() - first if first else 0.0}
c.sendall((json.dumps(r) + "\n").encode()); c.close(); print(json.dumps(r))
"""

# A TCP source: connects (timeout argv[4]), sends argv[3] bytes, half-closes,
# prints the sink's answer or {"error": ...}.
SOURCE = r"""
import json, socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
    c.settimeout(30); c.sendall(b"x" * int(sys.argv[3])); c.shutdown(socket.SHUT_WR)
    print(c.makefile().readline().strip() or json.dumps({"error": "no answer"}))
except OSError as e:
    print(json.dumps({"error": type(e).__name__, "errno": e.errno}))
"""

# UDP: listens on argv[1]:argv[2] for argv[3] s, meanwhile sends argv[5]
# datagrams to argv[4]:argv[2]; prints {"got": {source: n}, "sent": n, "send_errors": [errno]}.
UDP = r"""
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(0.05)
print("ready", flush=True); sys.stdin.readline()  # go
got, sent, errors = {}, 0, []
end = time.monotonic() + float(sys.argv[3]); k = 0
while time.monotonic() < end:
    if k < int(sys.argv[5]):
        k += 1
        try:
            s.sendto(b"hello", (sys.argv[4], int(sys.argv[2]))); sent += 1
        except OSError as e:
            errors.append(e.errno)
    try:
        _, (src, _) = s.recvfrom(100); got[src] = got.get(src, 0) + 1
    except socket.timeout:
        pass
print(json.dumps({"got": got, "sent": sent, "send_errors": errors}))
"""

# Connects to argv[1]:argv[2] with a 2 s timeout: prints {"errno": n} (0: connected).
CONNECT = r"""
import json, socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close(); print(json.dumps({"errno": 0}))
except socket.timeout:
    print(json.dumps({"errno": "timeout"}))
except OSError as e:
    print(json.dumps({"errno": e.errno}))
"""


def readline(p, timeout=10):
    r, _, _ = select.select([p.stdout], [], [], timeout)
    return p.stdout.readline().strip() if r else ""


def transfer(src, dst, nbytes, connect_timeout=2.0):
    """Sends nbytes from src to dst over TCP: (sink's result, source's result)."""
    sink = dst.popen([PY, "-c", SINK, dst.address, str(PORT), str(connect_timeout + 2)],
                     stdout=subprocess.PIPE, text=True)
    if readline(sink) != "ready":
        return {"error": "sink did not start"}, {}
    r = src.run([PY, "-c", SOURCE, dst.address, str(PORT), str(nbytes), str(connect_timeout)], timeout=60)
    out, _ = sink.communicate(timeout=30)
    sent = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"error": r.stderr}
    return json.loads(out.strip().splitlines()[-1]), sent


def udp_both_ways(a, b, count=20, seconds=1.0):
    """a and b each send `count` datagrams to the other while listening:
    (a's result, b's result)."""
    procs = [h.popen([PY, "-c", UDP, h.address, str(PORT + 1), str(seconds), o.address, str(count)],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for h, o in ((a, b), (b, a))]
    if not all(readline(p) == "ready" for p in procs):
        return {}, {}
    for p in procs:  # both listen before either sends
        p.stdin.write("go\n")
        p.stdin.flush()
    return tuple(json.loads(p.communicate(timeout=30)[0].strip().splitlines()[-1]) for p in procs)


def connect(src, address, port=PORT):
    r = src.run([PY, "-c", CONNECT, address, str(port)], timeout=30)
    return json.loads(r.stdout.strip().splitlines()[-1])["errno"] if r.stdout.strip() else r.stderr


def connect_both_ways(a, b):
    """Can a connect to b, and b to a? A listener on each, both tries at
    once: {"a->b": errno, "b->a": errno} (0: connected)."""
    listen = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4); print("ready", flush=True); time.sleep(float(sys.argv[3]))
"""
    listeners = [h.popen([PY, "-c", listen, h.address, str(PORT + 2), "5"], stdout=subprocess.PIPE, text=True)
                 for h in (a, b)]
    try:
        if not all(readline(p) == "ready" for p in listeners):
            return {"error": "listeners did not start"}
        tries = {f"{x.name}->{y.name}": x.popen([PY, "-c", CONNECT, y.address, str(PORT + 2)],
                                                 stdout=subprocess.PIPE, text=True) for x, y in ((a, b), (b, a))}
        out = {}
        for k, p in tries.items():
            text = p.communicate(timeout=30)[0].strip()
            out[k] = json.loads(text.splitlines()[-1])["errno"] if text else "no output"
        return out
    finally:
        for p in listeners:
            p.kill()
            p.wait()


def root_touched(subnet):
    """What of this run is in the root namespace: links of its pid's naming
    (sl<pid>..., slh<pid>...) and routes or addresses in its subnet. Only
    those, since other tests may add links there meanwhile."""
    pid = str(os.getpid())
    found = [x for x in emulated._root_links() if x.startswith(("sl" + pid, "slh" + pid))]
    for args in (["route", "show", "table", "all"], ["addr", "show"]):
        out = subprocess.run(["ip", "-4", "-o", *args], capture_output=True, text=True).stdout
        found += [line for line in out.splitlines() if any(
            "." in w and w[0].isdigit() and ipaddress.ip_network(w, strict=False).overlaps(subnet)
            for w in line.split() if all(p.isdigit() for p in w.replace("/", ".").split(".")))]
    return found


def machine_address():
    """The machine's own IPv4 address (its default route's source), or its
    first global one, or a TEST-NET address if it has none."""
    r = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.123"], capture_output=True, text=True).stdout.split()
    if "src" in r:
        return r[r.index("src") + 1]
    r = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    for word in r.split():
        if "/" in word and word[0].isdigit():
            return word.split("/")[0]
    return "192.0.2.1"


def dead(pid):
    """Gone, or a zombie nobody reaped yet (a container's pid 1 may not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_until(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def spawn_grandchild(host):
    """A shell on `host` whose child sleeps: (shell, sleeper's pid)."""
    p = host.popen(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!; wait"], stdout=subprocess.PIPE,
                   stderr=subprocess.DEVNULL, text=True)
    return p, int(readline(p) or 0)


def child():
    """--child: builds 2 hosts with a cut, a limit and processes on them,
    prints 'ready <pid> <popen pid> <grandchild pid>', then waits to be killed."""
    hs = emulated.Hosts(2)
    a, b = hs
    hs.cut(a, b)
    hs.limit_egress(a, 8)
    p = a.popen(["sleep", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, grandchild = spawn_grandchild(b)
    print(f"ready {os.getpid()} {p.pid} {grandchild}", flush=True)
    time.sleep(60)


def killed_run(c, sig, directory):
    """A child run killed by `sig` mid-test: what it leaves, and that the
    sweep removes the rest."""
    name = signal.Signals(sig).name
    log = os.path.join(directory, f"child-{name}.log")
    p = subprocess.Popen([PY, os.path.abspath(__file__), "--child"], stdout=subprocess.PIPE,
                         stderr=open(log, "w"), text=True)
    line = readline(p, timeout=30).split()
    if not c.check(len(line) == 4 and line[0] == "ready", f"{name}: a child run built its hosts", " ".join(line)):
        p.kill()
        p.wait()
        return
    pid, procs = int(line[1]), [int(x) for x in line[2:]]
    made = emulated.leftovers(pid)
    c.check(len(made) == 3, f"{name}: it made a switch and 2 host namespaces", " ".join(made))
    p.send_signal(sig)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    with open(log) as f:
        err = f.read().strip().splitlines()
    if sig == signal.SIGKILL:
        # (Another run's Hosts() sweeping in the few ms between the kill and
        # this look would remove them first: only a concurrent run can.)
        left = emulated.leftovers(pid)
        c.check(sorted(left) == sorted(made) and not any(dead(x) for x in procs),
                "SIGKILL: its namespaces and host processes stay (nothing could clean up)", " ".join(left))
        swept = emulated.sweep()
        c.check(set(made) <= set(swept), "the sweep removes the dead run's namespaces", " ".join(swept))
        c.check(not emulated.leftovers(pid) and wait_until(lambda: all(dead(x) for x in procs), 5),
                "... and kills what ran in them", str(procs))
        return
    want = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGHUP: 128 + signal.SIGHUP,
            signal.SIGINT: -signal.SIGINT}[sig]  # SIGINT: KeyboardInterrupt, then Python dies by the signal
    c.check(p.returncode == want, f"{name}: the run exits {want}", f"{p.returncode} {err[-1:] if err else ''}")
    c.check(not emulated.leftovers(pid), f"{name}: no namespace of the run is left")
    c.check(wait_until(lambda: all(dead(x) for x in procs), 5), f"{name}: its host processes are gone", str(procs))


def main():
    if sys.argv[1:] == ["--child"]:
        child()
        return
    why = emulated.available()
    if why:
        print(f"skipped: {why}")
        sys.exit(77)
    c = Checks()
    t0 = time.monotonic()
    outside = machine_address()
    print(f"iptables: {emulated._iptables()}; the machine's address: {outside}")
    with emulated.Hosts(3) as hs:
        a, b, cc = hs
        subnet = hs.subnet
        mine = emulated.leftovers(os.getpid())
        # 1. layout
        addrs = [ipaddress.ip_address(h.address) for h in hs]
        c.check(len(set(addrs)) == 3 and all(x in subnet for x in addrs) and subnet.is_private,
                "3 hosts, each its own address in one private /24", f"{subnet} {list(hs)}")
        c.check(not any(subnet.overlaps(n) for n in emulated._routed_networks() if n.prefixlen > 0),
                "the machine routes nothing in that /24")
        c.check(not root_touched(subnet), "the root namespace got no link, route or address of the run",
                str(root_touched(subnet)))
        c.check(sorted(mine) == sorted([hs.switch] + [h.ns for h in hs]),
                "a switch namespace and one per host, named by the run's pid", " ".join(mine))
        routes = a.run(["ip", "-4", "route", "show", "table", "all"]).stdout
        c.check("default" not in routes and str(subnet) in routes and
                all(line.startswith(("local", "broadcast")) or str(subnet) in line
                    for line in routes.splitlines() if line.strip()),
                "a host's only route is its /24", routes.replace("\n", "; "))
        r = b.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"])
        c.check(f"inet {b.address}/24" in r.stdout, "host.run runs on the host (its eth0 has its address)")

        # 2. reach
        got, sent = transfer(a, b, 1000)
        c.check(got.get("bytes") == 1000 and sent.get("bytes") == 1000, "TCP a -> b", json.dumps(sent))
        got, sent = transfer(b, a, 1000)
        c.check(got.get("bytes") == 1000 and sent.get("bytes") == 1000, "TCP b -> a", json.dumps(sent))
        e = connect(a, outside, 22)
        c.check(e == errno.ENETUNREACH, f"a host cannot reach the machine's own address {outside} (no route)",
                str(e))
        beyond = str(subnet.network_address + 256 + 1)  # the next /24
        e = connect(a, beyond)
        c.check(e == errno.ENETUNREACH, f"nor an address outside its /24 ({beyond})", str(e))
        c.check(not root_touched(subnet), "the root namespace is still untouched")

        # 3. a one-way cut
        ua, ub = udp_both_ways(a, b)
        c.check(ua.get("got", {}).get(b.address) == 20 and ub.get("got", {}).get(a.address) == 20,
                "before the cut: 20 datagrams each way", json.dumps([ua, ub]))
        hs.cut(a, b)
        rules_b = b.run([hs.iptables, "-w", "-S", "INPUT"]).stdout
        rules_a = a.run([hs.iptables, "-w", "-S"]).stdout
        c.check(f"-A INPUT -s {a.address}/32 -j DROP" in rules_b and "DROP" not in rules_a,
                "cut(a, b): one DROP rule, in b's INPUT for a's address; none in a", rules_b.replace("\n", "; "))
        ua, ub = udp_both_ways(a, b)
        c.check(ub.get("got", {}).get(a.address, 0) == 0 and ua.get("sent") == 20 and not ua.get("send_errors"),
                "cut(a, b): a's 20 datagrams to b leave a (sent without error) and none arrive",
                json.dumps(ua) + " " + json.dumps(ub))
        c.check(ua.get("got", {}).get(b.address) == 20, "... while b's 20 to a all arrive", json.dumps(ua))
        tcp = connect_both_ways(a, b)
        c.check(tcp.get("host-a->host-b") == "timeout" and tcp.get("host-b->host-a") == "timeout",
                "no TCP connection either way (a's SYNs, and a's SYN-ACKs to b, are lost)", json.dumps(tcp))
        got, sent = transfer(cc, b, 1000)
        c.check(got.get("bytes") == 1000, "c still reaches b", json.dumps(sent))
        hs.cut(a, b)  # idempotent
        hs.heal(a, b)
        rules_b = b.run([hs.iptables, "-w", "-S", "INPUT"]).stdout
        c.check("DROP" not in rules_b, "heal(a, b) leaves no rule (a second cut added none)",
                rules_b.replace("\n", "; "))
        ua, ub = udp_both_ways(a, b)
        c.check(ua.get("got", {}).get(b.address) == 20 and ub.get("got", {}).get(a.address) == 20,
                "healed: 20 datagrams each way", json.dumps([ua, ub]))
        tcp = connect_both_ways(a, b)
        c.check(tcp.get("host-a->host-b") == 0 and tcp.get("host-b->host-a") == 0, "healed: TCP both ways",
                json.dumps(tcp))

        # 4. an egress limit
        nbytes = 2 * 1000 * 1000
        hs.limit_egress(a, 8)
        q = a.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
        c.check("tbf" in q and "8Mbit" in q, "limit_egress(a, 8): a tbf qdisc at 8 Mbit on a's eth0", q.strip())
        got, sent = transfer(a, b, nbytes)
        # The sink times first byte to EOF. At 8 Mbit/s, 2 MB (16 Mbit) needs
        # 2.0 s; tbf lets at most its bucket (burst: 16 KiB at this rate, 0.016
        # s) leave unpaced, and the first byte's own packet is in the bucket,
        # so the receiver cannot see it all in under ~1.98 s. Headers only
        # add to that. 1.5 s leaves room for tbf's and the clocks' slack
        # without ever passing an unlimited link (milliseconds here).
        secs = got.get("seconds", 0)
        c.check(got.get("bytes") == nbytes and secs >= 1.5, "2 MB from a at 8 Mbit/s takes >= 1.5 s",
                f"{secs:.2f} s")
        got_back, _ = transfer(b, a, nbytes)
        back = got_back.get("seconds", 99)
        c.check(got_back.get("bytes") == nbytes and back < secs / 2,
                "b -> a (b's egress) is not limited", f"{back:.3f} s")
        hs.unlimit(a)
        hs.unlimit(a)  # none left: nothing to do
        q = a.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout
        got, _ = transfer(a, b, nbytes)
        c.check("tbf" not in q and got.get("bytes") == nbytes, "unlimit(a) removes it",
                f"{q.strip()}; 2 MB in {got.get('seconds', 0):.3f} s")

        # A second Hosts in the same process: names and subnet of its own, no
        # way to the first's hosts; closing it leaves the first's alone.
        with emulated.Hosts(1) as other:
            x = other[0]
            c.check(x.ns not in mine and not other.subnet.overlaps(subnet) and
                    connect(x, a.address) == errno.ENETUNREACH,
                    "a second Hosts at once: its own namespaces and /24, and no way to the first's",
                    f"{x.ns} {other.subnet}")
        c.check(sorted(emulated.leftovers(os.getpid())) == sorted(mine), "closing it leaves the first's")

        # 5. processes, for close()
        sleeper = a.popen(["sleep", "300"])
        shell, grandchild = spawn_grandchild(cc)
    c.check(sleeper.poll() is not None and shell.poll() is not None and
            wait_until(lambda: dead(grandchild), 5), "close() kills the hosts' processes, a grandchild too")
    c.check(not emulated.leftovers(os.getpid()), "close() leaves no namespace or link of the run")
    c.check(not root_touched(subnet), "nor in the root namespace")

    # 6. runs that are killed
    directory = scratch_dir("shardline-hosts-")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL):
        killed_run(c, sig, directory)
    print(f"took {time.monotonic() - t0:.1f} s")
    c.finish()


if __name__ == "__main__":
    main()
