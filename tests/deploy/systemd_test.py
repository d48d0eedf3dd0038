#!/usr/bin/env python3
"""deploy/systemd: the units, checked by systemd's own tools, offline.

No systemd needs to run: `systemd-analyze verify` loads the units in a scratch
root (--root) holding the host's stock units and stand-in programs at
/usr/bin/shardline-*, with generators and man pages off. A warning that names a
shardline unit (an unknown key, a value that does not parse) fails as an error
does, and a unit broken on purpose (an unknown directive, a bad value, a
missing program) must fail. `systemd-analyze security --offline` reads the
hardening back (the worker keeps the GPU device nodes: no device allow-list);
systemctl --root enables instances named by device (shardline-worker@cuda:0);
systemd-sysusers and systemd-tmpfiles apply their files to the scratch root.
Every flag in the units and env files must be one the programs define. When the
programs are built, the units' command lines run as the units would start
them: a CPU worker registers, the unit's ExecReload (SIGHUP) rotates a user
token, and SIGTERM stops both within 5 s.

    python3 tests/deploy/systemd_test.py        (ctest -L deploy: deploy_systemd)
"""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
UNITS = os.path.join(REPO, "deploy", "systemd")
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from harness import BUILD, Checks  # noqa: E402

COORDINATOR_UNIT = "shardline-coordinator.service"
WORKER_UNIT = "shardline-worker@.service"
PROGRAMS = {"shardline-coordinator": os.path.join(REPO, "server", "coordinator_main.cc"),
            "shardline-worker": os.path.join(REPO, "worker", "worker_main.cc")}
UNIT_DIR = "usr/lib/systemd/system"  # where the .deb installs them
# Exposure levels (0 best, 10 worst) systemd-analyze security must not exceed.
MAX_EXPOSURE = {COORDINATOR_UNIT: 2.0, WORKER_UNIT: 3.0}
ENV = dict(os.environ, SYSTEMD_COLORS="0", SYSTEMD_PAGER="cat", SYSTEMD_LOG_LEVEL="info")


def read(path):
    with open(path) as f:
        return f.read()


def parse_unit(text):
    """{section: [(key, value), ...]} as systemd reads it: keys may repeat."""
    sections, current = {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
        elif "=" in line and current is not None:
            key, value = line.split("=", 1)
            current.append((key.strip(), value.strip()))
    return sections


def values(unit, key, section="Service"):
    return [v for k, v in unit.get(section, []) if k == key]


def last(unit, key, section="Service"):
    found = values(unit, key, section)
    return found[-1] if found else None


def parse_env(text):
    """An EnvironmentFile: KEY=VALUE lines, the value optionally in double quotes."""
    env = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        env[key.strip()] = value
    return env


def command_line(text, specifiers, env):
    """An Exec line's argv: %X specifiers, ${VAR} as one word, $VAR split on whitespace."""
    argv = []
    for word in text.split():
        for spec, value in specifiers.items():
            word = word.replace(spec, value)
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            argv += env.get(word[1:], "").split()
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return argv


def flag_after(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def write_program(path):
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)


def scratch_root(base, programs=("shardline-coordinator", "shardline-worker", "kill")):
    """A file-system root with the host's stock units, stand-in programs, and the
    shardline files where a package installs them."""
    root = os.path.join(base, "root")
    stock = next(d for d in ("/usr/lib/systemd/system", "/lib/systemd/system") if os.path.isdir(d))
    shutil.copytree(stock, os.path.join(root, UNIT_DIR), symlinks=True)
    os.makedirs(os.path.join(root, "usr", "bin"))
    os.makedirs(os.path.join(root, "etc", "shardline"))
    os.symlink("usr/bin", os.path.join(root, "bin"))  # merged /usr, as on Debian 12
    for p in programs:
        write_program(os.path.join(root, "usr", "bin", p))
    for unit in (COORDINATOR_UNIT, WORKER_UNIT):
        shutil.copy(os.path.join(UNITS, unit), os.path.join(root, UNIT_DIR, unit))
    for src, dst in (("shardline.sysusers", "usr/lib/sysusers.d/shardline.conf"),
                     ("shardline.tmpfiles", "usr/lib/tmpfiles.d/shardline.conf")):
        os.makedirs(os.path.dirname(os.path.join(root, dst)), exist_ok=True)
        shutil.copy(os.path.join(UNITS, src), os.path.join(root, dst))
    return root


def verify(root, unit, alias=None):
    """systemd-analyze verify, strict: (ok, what it said about shardline units)."""
    arg = os.path.join(root, UNIT_DIR, unit) + (":" + alias if alias else "")
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", "--generators=false", "--root=" + root, arg],
                       capture_output=True, text=True, timeout=120, env=ENV)
    said = [l for l in (r.stdout + r.stderr).splitlines() if "shardline" in l]
    return r.returncode == 0 and not said, (r.returncode, said)


def security(root, unit):
    """(overall exposure, {json_field: entry}) from systemd-analyze security --offline."""
    base = ["systemd-analyze", "security", "--offline=yes", "--man=no", "--no-pager", "--root=" + root,
            os.path.join("/", UNIT_DIR, unit)]
    text = subprocess.run(base, capture_output=True, text=True, timeout=120, env=ENV)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", text.stdout + text.stderr)
    js = subprocess.run(base + ["--json=short"], capture_output=True, text=True, timeout=120, env=ENV)
    try:
        entries = {e["json_field"]: e for e in json.loads(js.stdout)}
    except (ValueError, KeyError):
        entries = {}
    return (float(m.group(1)) if m else None), entries


def defined_flags(source):
    return set(re.findall(r'add_(?:option|flag)\(\s*"(--[a-z0-9-]+)', read(source))) | {"--help"}


def mentioned_flags(text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


def env_file_flags(text):
    """The flags an env file sets, and those its comments offer to add (lines "#   --flag ...");
    not the prose, which may name the other program's flags."""
    offered = [l for l in text.splitlines() if re.match(r"#\s+--", l)]
    return set().union(*(mentioned_flags(v) for v in parse_env(text).values()), *map(mentioned_flags, offered))


def check_static(checks, base):
    units = {u: parse_unit(read(os.path.join(UNITS, u))) for u in (COORDINATOR_UNIT, WORKER_UNIT)}
    coord, worker = units[COORDINATOR_UNIT], units[WORKER_UNIT]
    envs = {COORDINATOR_UNIT: read(os.path.join(UNITS, "coordinator.env")),
            WORKER_UNIT: read(os.path.join(UNITS, "worker.env"))}

    # The directives the issue asks for, on both units.
    for name, u in units.items():
        checks.check(last(u, "User") == "shardline" and last(u, "Group") == "shardline",
                     f"{name}: User=/Group= shardline", f"{last(u, 'User')}/{last(u, 'Group')}")
        state = " ".join(values(u, "StateDirectory")).split()
        checks.check("shardline/checkpoints" in state, f"{name}: StateDirectory= has shardline/checkpoints",
                     str(state))
        checks.check(last(u, "Restart") in ("on-failure", "always") and last(u, "RestartSec") is not None,
                     f"{name}: Restart= with RestartSec=", f"{last(u, 'Restart')} {last(u, 'RestartSec')}")
        checks.check(last(u, "NoNewPrivileges") == "yes", f"{name}: NoNewPrivileges=yes")
        checks.check(last(u, "ProtectSystem") == "strict", f"{name}: ProtectSystem=strict")
        checks.check(last(u, "ProtectHome") in ("yes", "read-only", "tmpfs"), f"{name}: ProtectHome=",
                     str(last(u, "ProtectHome")))
        checks.check(last(u, "CapabilityBoundingSet") == "", f"{name}: no capabilities")
        stop = last(u, "TimeoutStopSec") or ""
        checks.check(stop.rstrip("s").isdigit() and int(stop.rstrip("s")) > 5,
                     f"{name}: TimeoutStopSec= above the programs' 5 s stop", stop)
        checks.check(values(u, "WantedBy", "Install") == ["multi-user.target"], f"{name}: WantedBy=multi-user.target")
    program = {COORDINATOR_UNIT: "shardline-coordinator", WORKER_UNIT: "shardline-worker"}
    for name, u in units.items():
        start = (last(u, "ExecStart") or "").split()
        checks.check(start[:1] == [f"/usr/bin/{program[name]}"], f"{name}: ExecStart runs /usr/bin/{program[name]}",
                     " ".join(start))
    cstart = last(coord, "ExecStart").split()
    state = " ".join(values(coord, "StateDirectory")).split()
    checks.check("shardline/coordinator" in state and flag_after(cstart, "--state-dir") == "%S/shardline/coordinator",
                 "coordinator: --state-dir is its StateDirectory=", flag_after(cstart, "--state-dir") or "")
    checks.check(last(coord, "ExecReload") == "/bin/kill -HUP $MAINPID", "coordinator: ExecReload= sends SIGHUP",
                 str(last(coord, "ExecReload")))
    checks.check(last(coord, "PrivateDevices") == "yes", "coordinator: PrivateDevices=yes")
    wstart = last(worker, "ExecStart").split()
    checks.check(flag_after(wstart, "--device") == "%i", "worker: the instance name is --device")
    # Each of these installs a device allow-list that would hide /dev/nvidia*.
    hiding = [f"{k}={v}" for k, v in worker["Service"]
              if (k in ("PrivateDevices", "ProtectClock") and v not in ("no", "false", "0"))
              or k == "DeviceAllow" or (k == "DevicePolicy" and v != "auto")]
    checks.check(not hiding, "worker: no device allow-list (GPU nodes reachable)", " ".join(hiding))
    checks.check(last(worker, "MemoryDenyWriteExecute") in (None, "no"), "worker: no MemoryDenyWriteExecute (CUDA JIT)")

    # Flags: every one the units and env files name is defined by its program.
    for name, u in units.items():
        defined = defined_flags(PROGRAMS[program[name]])
        named = mentioned_flags(last(u, "ExecStart")) | env_file_flags(envs[name])
        unknown = sorted(named - defined)
        checks.check(not unknown and len(named) > 3, f"{name}: its {len(named)} flags are {program[name]}'s",
                     "unknown: " + " ".join(unknown) if unknown else "")
        env_file = values(u, "EnvironmentFile")[0]
        var = re.search(r"\$([A-Z_]+)", last(u, "ExecStart")).group(1)
        checks.check(var in parse_env(envs[name]) and env_file.startswith("/etc/shardline/"),
                     f"{name}: ExecStart's ${var} is set in {env_file}")

    # systemd-analyze verify, in a scratch root.
    root = scratch_root(base)
    for unit, alias in ((COORDINATOR_UNIT, None), (WORKER_UNIT, None), (WORKER_UNIT, "shardline-worker@cpu.service"),
                        (WORKER_UNIT, "shardline-worker@0.service")):
        ok, said = verify(root, unit, alias)
        checks.check(ok, f"systemd-analyze verify {alias or unit}", "" if ok else str(said))

    # Instance names are devices, colon and all: systemctl enables them offline as it would on a host.
    enable = [COORDINATOR_UNIT, "shardline-worker@cuda:0.service", "shardline-worker@cpu.service"]
    r = subprocess.run(["systemctl", "--root=" + root, "enable", *enable], capture_output=True, text=True,
                       timeout=60, env=ENV)
    wants = os.path.join(root, "etc", "systemd", "system", "multi-user.target.wants")
    links = {n: os.readlink(os.path.join(wants, n)) for n in enable if os.path.islink(os.path.join(wants, n))}
    checks.check(r.returncode == 0 and links.get("shardline-worker@cuda:0.service") == f"/{UNIT_DIR}/{WORKER_UNIT}"
                 and len(links) == 3, "systemctl enable shardline-coordinator shardline-worker@cuda:0 @cpu",
                 r.stderr.strip()[-200:] if r.returncode else " ".join(sorted(links)))

    # ... and it must fail a broken unit.
    text = read(os.path.join(UNITS, COORDINATOR_UNIT))
    broken = {
        "an unknown directive": text.replace("ProtectSystem=strict", "ProtectSytem=strict"),
        "a value that does not parse": text.replace("Restart=on-failure", "Restart=sometimes"),
        "a missing ExecStart program": text.replace("ExecStart=/usr/bin/shardline-coordinator",
                                                    "ExecStart=/usr/bin/shardline-coordinatr"),
        "a section typo": text.replace("[Service]", "[Servce]"),
    }
    for what, bad in broken.items():
        assert bad != text, what
        with open(os.path.join(root, UNIT_DIR, "shardline-broken.service"), "w") as f:
            f.write(bad)
        ok, (rc, said) = verify(root, "shardline-broken.service")
        checks.check(not ok, f"verify fails a unit with {what}", f"rc={rc}: {said[0] if said else ''}")
    os.remove(os.path.join(root, UNIT_DIR, "shardline-broken.service"))
    os.remove(os.path.join(root, "usr", "bin", "shardline-worker"))
    ok, (rc, said) = verify(root, WORKER_UNIT, "shardline-worker@cpu.service")
    checks.check(not ok, "verify fails the worker when /usr/bin/shardline-worker is absent",
                 f"rc={rc}: {said[0] if said else ''}")
    write_program(os.path.join(root, "usr", "bin", "shardline-worker"))

    # The hardening as systemd reads it.
    for unit in (COORDINATOR_UNIT, WORKER_UNIT):
        exposure, e = security(root, unit)
        checks.check(exposure is not None and exposure <= MAX_EXPOSURE[unit],
                     f"systemd-analyze security {unit}: exposure {exposure} <= {MAX_EXPOSURE[unit]}")
        field = lambda k: e.get(k, {})  # noqa: E731
        checks.check(field("UserOrDynamicUser").get("set") is True and "non-root" in
                     field("UserOrDynamicUser").get("description", ""), f"security {unit}: a static non-root user")
        checks.check(field("NoNewPrivileges").get("set") is True, f"security {unit}: NoNewPrivileges")
        checks.check("strict" in field("ProtectSystem").get("description", ""), f"security {unit}: ProtectSystem strict",
                     field("ProtectSystem").get("description", ""))
    _, e = security(root, WORKER_UNIT)
    checks.check(e.get("PrivateDevices", {}).get("set") is False
                 and e.get("DeviceAllow", {}).get("description") == "Service has no device ACL",
                 "security worker: no device ACL (/dev/nvidia* reachable)", e.get("DeviceAllow", {}).get("description", ""))

    # sysusers and tmpfiles, applied to the scratch root by name as the README does.
    r = subprocess.run(["systemd-sysusers", "--root=" + root, "shardline.conf"], capture_output=True, text=True,
                       timeout=60)
    users = {l.split(":")[0]: l.split(":") for l in read(os.path.join(root, "etc", "passwd")).splitlines()} \
        if os.path.exists(os.path.join(root, "etc", "passwd")) else {}
    u = users.get("shardline", [])
    checks.check(r.returncode == 0 and len(u) == 7 and int(u[2]) < 1000 and u[5] == "/var/lib/shardline"
                 and u[6].endswith("nologin"), "systemd-sysusers creates the system user shardline", ":".join(u))
    r = subprocess.run(["systemd-tmpfiles", "--root=" + root, "--create", "shardline.conf"], capture_output=True,
                       text=True, timeout=60)
    st = os.stat(os.path.join(root, "etc", "shardline"))
    checks.check(r.returncode == 0 and (st.st_mode & 0o7777) == 0o750 and st.st_uid == 0 and u
                 and st.st_gid == int(u[3]), "systemd-tmpfiles makes /etc/shardline 0750 root:shardline",
                 f"{st.st_mode & 0o7777:o} {st.st_uid}:{st.st_gid}")
    return units, envs


class Proc:
    """A program started from a unit's command line; stdout and stderr collected."""

    def __init__(self, argv, log):
        self.log = log
        self.lines = []
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        with open(self.log, "w") as f:
            for line in self.p.stdout:
                self.lines.append(line.rstrip("\n"))
                f.write(line)
                f.flush()

    def wait_line(self, pattern, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.p.poll() is not None:
                time.sleep(0.2)
                return next((m for m in (re.search(pattern, l) for l in list(self.lines)) if m), None)
            time.sleep(0.1)
        return None

    def stop(self, timeout):
        """SIGTERM (KillSignal=); (exit code, seconds) or (None, None) if still running."""
        t0 = time.time()
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None, None
        return rc, time.time() - t0


def write_secret(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def check_live(checks, base, units, envs):
    """The units' command lines, run as systemd would start them, on the built programs."""
    built = {p: os.path.join(BUILD, d, p) for p, d in (("shardline-coordinator", "server"),
                                                        ("shardline-worker", "worker"), ("shardctl", "client"))}
    missing = [p for p in built.values() if not os.access(p, os.X_OK)]
    if missing:  # tests/run.sh builds them all: a missing one is a failure, not a pass
        checks.check(False, "the programs the units start are built", " ".join(missing))
        return
    live = os.path.join(base, "live")
    etc = os.path.join(live, "etc", "shardline")
    os.makedirs(etc)
    user_old, user_new, worker_token, scrape = (secrets.token_hex(32) for _ in range(4))
    write_secret(os.path.join(etc, "user-tokens"), user_old + "\n")
    write_secret(os.path.join(etc, "worker-tokens"), worker_token + "\n")
    write_secret(os.path.join(etc, "worker-token"), worker_token + "\n")
    write_secret(os.path.join(etc, "scrape-tokens"), scrape + "\n")
    for name, token in (("old", user_old), ("new", user_new)):
        write_secret(os.path.join(live, f"client-{name}"), token + "\n")
    state_root = os.path.join(live, "var", "lib")
    cache_root = os.path.join(live, "var", "cache")
    for d in ("shardline/coordinator", "shardline/checkpoints"):  # what StateDirectory= creates
        os.makedirs(os.path.join(state_root, d), mode=0o750)

    def argv_of(unit, instance, overrides):
        u = units[unit]
        env = parse_env(envs[unit])
        for kv in values(u, "Environment"):
            for item in kv.split():
                k, v = item.split("=", 1)
                env[k] = v
        spec = {"%S": state_root, "%C": cache_root, "%i": instance, "%I": instance}
        argv = command_line(last(u, "ExecStart"), spec, env)
        argv[0] = built[os.path.basename(argv[0])]
        argv = [live + a if a.startswith("/etc/shardline/") else a for a in argv]
        for flag, value in overrides.items():
            argv[argv.index(flag) + 1] = value
        return argv

    procs = []
    try:
        cargv = argv_of(COORDINATOR_UNIT, "", {"--listen": "127.0.0.1:0", "--metrics-listen": "127.0.0.1:0"})
        coord = Proc(cargv, os.path.join(live, "coordinator.log"))
        procs.append(coord)
        m = coord.wait_line(r"listening on [^ ]*:(\d+)", 30)
        checks.check(m is not None, "live: the coordinator starts from its unit's command line",
                     "" if m else " | ".join(coord.lines[-3:]))
        if not m:
            return
        address = f"127.0.0.1:{m.group(1)}"
        mp = coord.wait_line(r"metrics on port (\d+)", 5)
        state_dir = os.path.join(state_root, "shardline", "coordinator")
        checks.check((os.stat(state_dir).st_mode & 0o777) == 0o700,
                     "live: the coordinator tightens its StateDirectory= to 0700",
                     f"{os.stat(state_dir).st_mode & 0o777:o}")
        if mp:
            url = f"http://127.0.0.1:{mp.group(1)}/metrics"
            try:
                urllib.request.urlopen(url, timeout=5)
                anon = 200
            except urllib.error.HTTPError as e:
                anon = e.code
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {scrape}"})
            with urllib.request.urlopen(req, timeout=5) as r:
                authed = r.status
            checks.check(anon == 401 and authed == 200, "live: /metrics needs the scrape token",
                         f"without {anon}, with {authed}")

        wargv = argv_of(WORKER_UNIT, "cpu", {"--coordinator": address})
        worker = Proc(wargv, os.path.join(live, "worker.log"))
        procs.append(worker)

        def ctl(token, *args):
            r = subprocess.run([built["shardctl"], "--coordinator", address, "--token-file",
                                os.path.join(live, f"client-{token}"), "--json", *args],
                               capture_output=True, text=True, timeout=30)
            return r.returncode, r.stdout, r.stderr

        registered = []
        deadline = time.time() + 60
        while time.time() < deadline and not registered and worker.p.poll() is None:
            rc, out, _ = ctl("old", "workers")
            if rc == 0:
                registered = [w for w in json.loads(out)["workers"] if w["device"] == "cpu"]
            time.sleep(0.5)
        checks.check(len(registered) == 1 and registered[0]["metrics_port"] > 0,
                     "live: shardline-worker@cpu registers (device cpu, a metrics port)",
                     json.dumps(registered) if registered else " | ".join(worker.lines[-3:]))

        # ExecReload, as systemctl reload runs it.
        def reload():
            n = sum("tokens_reloaded" in l for l in coord.lines)
            argv = command_line(last(units[COORDINATOR_UNIT], "ExecReload"), {}, {"MAINPID": str(coord.p.pid)})
            argv[0] = shutil.which("kill") or argv[0]
            subprocess.run(argv, check=True, timeout=10)
            deadline = time.time() + 10
            while time.time() < deadline and sum("tokens_reloaded" in l for l in coord.lines) == n:
                time.sleep(0.1)
            return sum("tokens_reloaded" in l for l in coord.lines) > n

        with open(os.path.join(etc, "user-tokens"), "a") as f:  # appending keeps owner and mode
            f.write(user_new + "\n")
        reloaded = reload()
        both = ctl("old", "jobs")[0] == 0 and ctl("new", "jobs")[0] == 0
        checks.check(reloaded and both, "live: reload adds the new token (both accepted)")
        write_secret(os.path.join(etc, "user-tokens"), user_new + "\n")
        reloaded = reload()
        rc_old, _, err_old = ctl("old", "jobs")
        rc_new = ctl("new", "jobs")[0]
        checks.check(reloaded and rc_old != 0 and re.search(r"token|unauthenticated", err_old, re.I) and rc_new == 0,
                     "live: reload again retires the old token", err_old.strip()[:120])
        checks.check(coord.p.poll() is None and worker.p.poll() is None, "live: both still running after reloads")

        # systemctl stop: SIGTERM; both are bounded to 5 s (TimeoutStopSec= is above it), and each
        # stops by its own handling (exit 0), not by the signal's default action.
        for name, p in (("worker", worker), ("coordinator", coord)):
            rc, took = p.stop(15)
            how = {0: "exited 0", -signal.SIGTERM: "killed by SIGTERM's default action, not its own stop"}.get(rc, rc)
            checks.check(rc == 0 and took is not None and took < 5.0,
                         f"live: the {name} stops on SIGTERM within 5 s",
                         f"{how} in {took:.2f} s" if took is not None else "did not stop in 15 s")
    finally:
        for p in procs:
            if p.p.poll() is None:
                p.p.kill()
                p.p.wait()


def main():
    checks = Checks()
    tools = [t for t in ("systemd-analyze", "systemctl", "systemd-sysusers", "systemd-tmpfiles") if not shutil.which(t)]
    if not checks.check(not tools, "systemd's tools are installed (Debian package systemd)", " ".join(tools)):
        checks.finish()
    base = tempfile.mkdtemp(prefix="shardline-systemd-")
    try:
        units, envs = check_static(checks, base)
        check_live(checks, base, units, envs)
    finally:
        checks.remove_unless_failed(base)
    checks.finish()


if __name__ == "__main__":
    main()
