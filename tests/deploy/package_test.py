"""cmake --install and the .deb (cpack -G DEB), README "Installing".

Installs the build into a scratch DESTDIR and checks the tree against the
expected file list, every program's RUNPATH (readelf) and that each runs --help
from where it is installed, both through the configured SHARDLINE_LIBTORCH_DIR
and through the /usr/lib/shardline/site-packages link an operator makes. Then
builds the package with cpack in a scratch directory and checks its contents
(the same list), control fields, conffiles and postinst with dpkg-deb; runs the
extracted coordinator; installs it with dpkg --root into a scratch root (the
real system is untouched) where postinst creates the user and /etc/shardline.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import Checks  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("SHARDLINE_BUILD", os.path.join(ROOT, "build")))
PROGRAMS = ["shardline-coordinator", "shardline-worker", "shardline-train", "shardctl"]
# Every file the install and the package must hold (paths under the root).
EXPECTED = {f"usr/bin/{p}" for p in PROGRAMS} | {
    "usr/lib/systemd/system/shardline-coordinator.service",
    "usr/lib/systemd/system/shardline-worker@.service",
    "usr/lib/sysusers.d/shardline.conf",
    "usr/lib/tmpfiles.d/shardline.conf",
    "etc/shardline/coordinator.env",
    "etc/shardline/worker.env",
    "usr/share/doc/shardline/examples/coordinator.env",
    "usr/share/doc/shardline/examples/worker.env",
    "usr/share/doc/shardline/README.md",
    "usr/share/doc/shardline/README.systemd.md",
    "usr/share/shardline/prometheus/alerts.yml",
    "usr/share/shardline/prometheus/prometheus-local.yml",
    "usr/share/shardline/prometheus/prometheus-kubernetes.yml",
    "usr/share/shardline/grafana/shardline-dashboard.json",
    "usr/share/shardline/grafana/provisioning/dashboards/shardline.yml",
    "usr/share/shardline/grafana/provisioning/datasources/prometheus.yml",
}
CONFFILES = ["/etc/shardline/coordinator.env", "/etc/shardline/worker.env"]
LINK_RPATH = "$ORIGIN/../lib/shardline/site-packages/torch/lib"

c = Checks()
t0 = time.monotonic()


def run(cmd, **kw):
    kw.setdefault("timeout", 300)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def missing_from(files):
    """The expected files a listing lacks (the check every listing goes through)."""
    return sorted(EXPECTED - set(files))


def cache(name):
    with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
        for line in f:
            m = re.match(rf"{name}:[A-Z]+=(.*)$", line.rstrip("\n"))
            if m:
                return m.group(1)
    return None


def runpath(path):
    out = run(["readelf", "-d", path]).stdout
    m = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", out)
    return m.group(1).split(":") if m else []


def tree(root):
    return {os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs}


def helps(path, name):
    r = run([path, "--help"], timeout=30)
    return c.check(r.returncode == 0 and "Usage" in r.stdout + r.stderr, name,
                   f"rc={r.returncode} {(r.stderr or r.stdout)[-300:]}" if r.returncode else "")


# The checker itself: a listing without a unit or a program must fail.
c.check(missing_from(EXPECTED - {"usr/lib/systemd/system/shardline-worker@.service"})
        == ["usr/lib/systemd/system/shardline-worker@.service"], "checker: a missing unit is named")
c.check(missing_from(EXPECTED - {"usr/bin/shardctl"}) == ["usr/bin/shardctl"],
        "checker: a missing program is named")

for p in ("server/shardline-coordinator", "worker/shardline-worker", "worker/shardline-train", "client/shardctl"):
    if not os.path.exists(os.path.join(BUILD, p)):
        c.check(False, "built", f"{p} missing in {BUILD}")
        c.finish()

libtorch_dir = cache("SHARDLINE_LIBTORCH_DIR")
torch_dir = cache("SHARDLINE_PYTHON") and run(
    [cache("SHARDLINE_PYTHON"), "-c", "import torch,os;print(os.path.dirname(torch.__file__))"]).stdout.strip()
site = os.path.dirname(torch_dir)
work = tempfile.mkdtemp(prefix="shardline-package-")

# --- cmake --install into a DESTDIR -------------------------------------------
dest = os.path.join(work, "dest")
r = run(["cmake", "--install", BUILD, "--prefix", "/usr"], env=dict(os.environ, DESTDIR=dest))
c.check(r.returncode == 0, "cmake --install", r.stderr[-500:])
files = tree(dest)
c.check(not missing_from(files), "install: expected files", f"missing {missing_from(files)}")
c.check(os.path.isdir(os.path.join(dest, "usr/lib/shardline")), "install: usr/lib/shardline (the link's place)")
for p in PROGRAMS:
    path = os.path.join(dest, "usr/bin", p)
    rp = runpath(path)
    c.check(rp[:1] == [LINK_RPATH] and libtorch_dir in rp and not any(e.startswith(BUILD) for e in rp),
            f"install: RUNPATH of {p}", ":".join(rp))
    # Through SHARDLINE_LIBTORCH_DIR (here the build's wheel): no environment.
    ldd = run(["ldd", path]).stdout
    c.check("not found" not in ldd, f"install: ldd {p} resolves everything",
            " ".join(l.strip() for l in ldd.splitlines() if "not found" in l))
    helps(path, f"install: {p} --help")
# Through the link an operator makes: the wheel's libraries are found there first.
os.symlink(site, os.path.join(dest, "usr/lib/shardline/site-packages"))
worker = os.path.join(dest, "usr/bin/shardline-worker")
ldd = run(["ldd", worker]).stdout
via = os.path.join(dest, "usr/bin/../lib/shardline/site-packages/torch/lib/libtorch_cpu.so")
c.check(f"libtorch_cpu.so => {via}" in ldd, "install: libtorch_cpu.so found through usr/lib/shardline/site-packages",
        next((l.strip() for l in ldd.splitlines() if "libtorch_cpu" in l), "absent"))
helps(worker, "install: shardline-worker --help through the link")

# --- cpack -G DEB ---------------------------------------------------------------
pkgdir = os.path.join(work, "pkg")
os.makedirs(pkgdir)
t = time.monotonic()
r = run(["cpack", "-G", "DEB", "--config", os.path.join(BUILD, "CPackConfig.cmake"), "-B", pkgdir],
        cwd=pkgdir, timeout=600)
debs = [f for f in os.listdir(pkgdir) if f.endswith(".deb")]
c.check(r.returncode == 0 and len(debs) == 1, "cpack -G DEB", f"{time.monotonic() - t:.0f} s" + ("" if r.returncode == 0 else f" {r.stderr[-500:]}"))
if not debs:
    c.finish()
deb = os.path.join(pkgdir, debs[0])
with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
    version = re.search(r"project\(shardline VERSION (\S+)", f.read()).group(1)
c.check(debs[0] == f"shardline_{version}_amd64.deb", "deb: file name", f"{debs[0]} {os.path.getsize(deb) / 1e6:.1f} MB")

listing = run(["dpkg-deb", "-c", deb]).stdout
pkg_files = {l.split()[5][2:] for l in listing.splitlines() if l and not l.startswith("d")}
c.check(not missing_from(pkg_files), "deb: expected files (dpkg-deb -c)", f"missing {missing_from(pkg_files)}")
c.check(not any("torch" in f or "nccl" in f for f in pkg_files), "deb: carries no LibTorch")


def field(name):
    return run(["dpkg-deb", "-f", deb, name]).stdout.strip()


c.check(field("Package") == "shardline" and field("Version") == version, "deb: Package and Version",
        f"{field('Package')} {field('Version')}")
c.check("@" in field("Maintainer") and field("Description").startswith("sharded data-parallel training service"),
        "deb: Maintainer and Description")
depends = field("Depends")
c.check(all(d in depends for d in ("libc6", "libgrpc++", "libsqlite3")) and "torch" not in depends,
        "deb: Depends from dpkg-shlibdeps", depends)
info = run(["dpkg-deb", "-I", deb, "conffiles"]).stdout.split()
c.check(info == CONFFILES, "deb: conffiles", " ".join(info))
postinst = run(["dpkg-deb", "-I", deb, "postinst"]).stdout
c.check("systemd-sysusers" in postinst and "systemd-tmpfiles" in postinst, "deb: postinst")

# --- extracted ------------------------------------------------------------------
ext = os.path.join(work, "extracted")
r = run(["dpkg-deb", "-x", deb, ext])
c.check(r.returncode == 0, "dpkg-deb -x", r.stderr)
helps(os.path.join(ext, "usr/bin/shardline-coordinator"), "extracted: shardline-coordinator --help")
helps(os.path.join(ext, "usr/bin/shardctl"), "extracted: shardctl --help")

# --- dpkg --root into a scratch root (postinst runs chrootless, on DPKG_ROOT) ---
root = os.path.join(work, "root")
os.makedirs(os.path.join(root, "var/lib/dpkg/info"))
os.makedirs(os.path.join(root, "var/lib/dpkg/updates"))
for f in ("status", "available"):
    open(os.path.join(root, "var/lib/dpkg", f), "w").close()
r = run(["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", "--log=/dev/null", "-i", deb])
c.check(r.returncode == 0, "dpkg --root -i", "" if r.returncode == 0 else (r.stdout + r.stderr)[-500:])
status = run(["dpkg", f"--root={root}", "-s", "shardline"]).stdout
c.check("Status: install ok installed" in status, "dpkg --root: installed")
c.check(not missing_from(tree(root)), "dpkg --root: expected files", f"missing {missing_from(tree(root))}")
groups = {}
if os.path.exists(os.path.join(root, "etc/group")):
    with open(os.path.join(root, "etc/group")) as f:
        groups = {l.split(":")[0]: int(l.split(":")[2]) for l in f if l.count(":") >= 3}
with open(os.path.join(root, "etc/passwd")) if os.path.exists(os.path.join(root, "etc/passwd")) else open(os.devnull) as f:
    passwd = f.read()
c.check(re.search(r"^shardline:x:\d+:\d+:.*:/usr/sbin/nologin$", passwd, re.M) is not None,
        "postinst: user shardline (sysusers)")
st = os.stat(os.path.join(root, "etc/shardline"))
c.check(oct(st.st_mode & 0o777) == "0o750" and st.st_gid == groups.get("shardline"),
        "postinst: /etc/shardline 0750 group shardline (tmpfiles)", f"{oct(st.st_mode & 0o777)} gid {st.st_gid}")
r = run(["dpkg", f"--root={root}", "--force-script-chrootless", "--log=/dev/null", "-r", "shardline"])
c.check(r.returncode == 0 and os.path.exists(os.path.join(root, "etc/shardline/coordinator.env"))
        and not os.path.exists(os.path.join(root, "usr/bin/shardline-coordinator")),
        "dpkg --root -r: programs gone, conffiles kept", "" if r.returncode == 0 else (r.stdout + r.stderr)[-300:])

shutil.rmtree(work, ignore_errors=True)
print(f"package test: {time.monotonic() - t0:.0f} s")
c.finish()
