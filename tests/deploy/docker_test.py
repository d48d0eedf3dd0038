#!/usr/bin/env python3
"""deploy/docker: the images built by a real dockerd, and the demo's job run in containers.

The test starts a dockerd of its own (its own socket, data root and exec root,
no iptables, no bridge; stopped at the end, every wait with a deadline), so
it needs root, dockerd (docker.io) and debootstrap, and touches no other
daemon. deploy/docker/build-images.sh builds the .deb with cpack, debootstraps
the base (cached under $XDG_CACHE_HOME or ~/.cache/shardline/docker, keyed by
its package list: a second run skips it) and builds shardline/coordinator and
shardline/worker with no network. Then:

- each image's entrypoint, user (10001:10001), ports, health check and labels
  (docker image inspect); --version of every program inside them; they run
  as the non-root user;
- in the worker image, `ldd -r` of shardline-worker, libtorch_cuda.so (which
  the worker loads on a GPU), libtorch_cuda_linalg, cuDNN and NCCL resolves
  everything from /usr/lib/shardline/site-packages (only the driver's
  libcuda.so.1 may be absent: the NVIDIA container toolkit brings it); a
  container with libnccl removed must fail the same check;
- a coordinator and two CPU workers in containers (--network host, loopback
  only: Gloo binds to loopback), with user and worker tokens and a shared
  /shared volume, train the demo's character-level GPT on English text (the
  README) with full_shard; `shardctl submit --follow` run in the coordinator's
  container ends SUCCEEDED with a committed checkpoint written by uid 10001;
  the coordinator's health check turns healthy; a worker stops on docker stop.

    python3 tests/deploy/docker_test.py        (ctest -R deploy_docker, label deploy)

SHARDLINE_TEST_DOCKER_HOST=unix:///var/run/docker.sock uses that daemon
instead of starting one (its images are then replaced by the test's).
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from harness import BUILD, Checks, free_ports  # noqa: E402

BUILD = os.path.abspath(BUILD)
SITE = "/usr/lib/shardline/site-packages"
UID = "10001"
PREFIX = "shardline-dockertest"
t0 = time.monotonic()
c = Checks()


def log(msg):
    print(f"[{time.monotonic() - t0:5.0f} s] {msg}", flush=True)


class Docker:
    """The docker client against one daemon (DOCKER_HOST)."""

    def __init__(self, host):
        self.host = host
        # Debian's client matches Debian's daemon; any newer one negotiates down.
        self.cli = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")
        self.env = dict(os.environ, DOCKER_HOST=host, DOCKER_BUILDKIT="0")

    def __call__(self, *args, timeout=120, check=False):
        try:
            r = subprocess.run([self.cli, *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired as e:
            r = subprocess.CompletedProcess(e.cmd, 124, e.stdout or "", f"timed out after {timeout} s")
            if isinstance(r.stdout, bytes):
                r.stdout = r.stdout.decode(errors="replace")
        if check and r.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args[:3])}: {r.stderr.strip()[-800:]}")
        return r

    def answers(self):
        return self("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0


class Dockerd:
    """A private dockerd: its own socket, data root, exec root and pid file."""

    def __init__(self, base):
        self.base = base
        self.sock = os.path.join(base, "docker.sock")
        self.out = open(os.path.join(base, "dockerd.log"), "w")
        argv = ["dockerd", "--host", "unix://" + self.sock, "--data-root", os.path.join(base, "data"),
                "--exec-root", os.path.join(base, "exec"), "--pidfile", os.path.join(base, "dockerd.pid"),
                "--iptables=false", "--ip-masq=false", "--bridge=none",
                # Its own namespaces should it share a system containerd.
                "--containerd-namespace", "shardline-test", "--containerd-plugins-namespace", "shardline-test-plugins"]
        self.p = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)
        self.docker = Docker("unix://" + self.sock)

    def wait(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline and self.p.poll() is None:
            if os.path.exists(self.sock) and self.docker.answers():
                return True
            time.sleep(0.5)
        return False

    def tail(self, n=20):
        with open(os.path.join(self.base, "dockerd.log")) as f:
            return "".join(f.readlines()[-n:])

    def stop(self, timeout=30):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self.out.close()


def unmount_under(path):
    """Whatever is still mounted under path (a daemon's overlays after a SIGKILL, the /proc of a
    debootstrap that was stopped), deepest first, so that removing path stays inside it."""
    with open("/proc/mounts") as f:
        mounts = [l.split()[1] for l in f if l.split()[1].startswith(path.rstrip("/") + "/")]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)


def reap_stale(parent="/var/tmp"):
    """A private dockerd an earlier run left behind (killed past its deadline): stopped, its roots removed."""
    for d in glob.glob(os.path.join(parent, "sl-dk-*")):
        try:  # a run still going (its test process alive) is left alone
            with open(os.path.join(d, "owner.pid")) as f:
                if os.path.exists(f"/proc/{int(f.read().strip())}"):
                    continue
        except (OSError, ValueError):
            try:  # or one that has only just made its directory
                if time.time() - os.stat(d).st_mtime < 120:
                    continue
            except OSError:
                continue
        try:
            with open(os.path.join(d, "dockerd.pid")) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                ours = (d + "/docker.sock").encode() in f.read()
        except (OSError, ValueError):
            pid, ours = None, False
        if ours:
            log(f"stopping dockerd {pid} left by an earlier run in {d}")
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 30
            while time.time() < deadline and os.path.exists(f"/proc/{pid}"):
                time.sleep(0.5)
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
        unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)


def unresolved(ldd_output):
    """The lines of `ldd -r` output naming a library not found or a symbol undefined."""
    return [l.strip() for l in ldd_output.splitlines() if "not found" in l or "undefined symbol" in l]


def write_private(path, text, owner):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    os.chown(path, owner, owner)


def main():
    for p in ("server/shardline-coordinator", "worker/shardline-worker", "client/shardctl"):
        if not os.path.exists(os.path.join(BUILD, p)):
            c.check(False, "built", f"{p} missing in {BUILD}")
            c.finish()
    if os.geteuid() != 0:
        c.check(False, "root", "dockerd and debootstrap need root")
        c.finish()
    for tool in ("dockerd", "debootstrap", "cpack", "dpkg-deb"):
        if not shutil.which(tool):
            c.check(False, f"{tool} installed", "tests/deps.sh installs docker.io, debootstrap and dpkg-dev")
            c.finish()

    # The checker: a library not found and an undefined symbol are both caught.
    c.check(unresolved("\tlibnccl.so.2 => not found\n\tlibc.so.6 => /lib/libc.so.6 (0x1)\n")
            == ["libnccl.so.2 => not found"], "checker: a missing library is named")
    c.check(len(unresolved("undefined symbol: ncclCommInitRank\t(/usr/bin/x)\n")) == 1,
            "checker: an undefined symbol is named")

    # ctest's timeout or ^C: stop the daemon and its containers all the same.
    def interrupted(signum, _frame):
        raise SystemExit(f"interrupted by signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    reap_stale()
    base = tempfile.mkdtemp(prefix="sl-dk-", dir="/var/tmp")  # short: unix socket paths
    with open(os.path.join(base, "owner.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    daemon = None
    docker = None
    try:
        if os.environ.get("SHARDLINE_TEST_DOCKER_HOST"):
            docker = Docker(os.environ["SHARDLINE_TEST_DOCKER_HOST"])
            c.check(docker.answers(), "dockerd answers", docker.host)
        else:
            daemon = Dockerd(base)
            ok = daemon.wait(60)
            c.check(ok, "private dockerd started", f"{daemon.sock}" if ok else daemon.tail())
            docker = daemon.docker
        if not c.failed:
            run_all(docker, base)
    finally:
        if docker is not None:
            ids = docker("ps", "-aq", "--filter", f"name={PREFIX}", timeout=30).stdout.split()
            if ids:
                docker("rm", "-f", *ids, timeout=60)
        if daemon is not None:
            daemon.stop()
        unmount_under(base)
        shutil.rmtree(base, ignore_errors=True)
    log("docker test done")
    c.finish()


def run_all(docker, base):
    # --- the images ---------------------------------------------------------------
    t = time.monotonic()
    # Its scratch directory inside ours (removed with it whatever happens); its process group
    # stopped if this test is.
    p = subprocess.Popen([os.path.join(REPO, "deploy", "docker", "build-images.sh"), "--build", BUILD],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(docker.env, TMPDIR=base, DOCKER=docker.cli))
    try:
        out, err = p.communicate(timeout=780)
    except BaseException:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
        raise
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    print(r.stdout, end="")
    c.check(r.returncode == 0, "build-images.sh", f"{time.monotonic() - t:.0f} s"
            + ("" if r.returncode == 0 else " " + r.stderr[-1500:]))
    if r.returncode != 0:
        return
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        version = re.search(r"project\(shardline VERSION (\S+)", f.read()).group(1)

    images = {}
    for name, program, ports in (("coordinator", "shardline-coordinator", {"50051/tcp", "9400/tcp"}),
                                 ("worker", "shardline-worker", {"9401/tcp"})):
        ref = f"shardline/{name}:{version}"
        r = docker("image", "inspect", ref)
        if not c.check(r.returncode == 0, f"{name}: image {ref} exists", r.stderr.strip()):
            continue
        info = json.loads(r.stdout)[0]
        images[name] = info
        cfg = info["Config"]
        size = info["Size"] / 1e6
        c.check(cfg.get("Entrypoint") == [program], f"{name}: entrypoint {program}", str(cfg.get("Entrypoint")))
        c.check(cfg.get("User") == f"{UID}:{UID}", f"{name}: USER {UID}:{UID}", str(cfg.get("User")))
        c.check(set(cfg.get("ExposedPorts") or {}) == ports, f"{name}: EXPOSE {' '.join(sorted(ports))}",
                str(sorted(cfg.get("ExposedPorts") or {})))
        labels = cfg.get("Labels") or {}
        c.check(labels.get("org.opencontainers.image.version") == version
                and re.fullmatch(r"[0-9a-f]{12}|unknown", labels.get("org.opencontainers.image.revision", "")),
                f"{name}: OCI labels", f"{labels.get('org.opencontainers.image.version')} "
                f"{labels.get('org.opencontainers.image.revision')}")
        c.check(docker("image", "inspect", f"shardline/{name}:latest").returncode == 0, f"{name}: tag latest")
        log(f"{ref}: {size:.0f} MB")
    if len(images) != 2:
        return
    c.check(images["coordinator"]["Size"] < 400e6, "coordinator: image carries no LibTorch",
            f"{images['coordinator']['Size'] / 1e6:.0f} MB")
    hc = images["coordinator"]["Config"].get("Healthcheck") or {}
    c.check("50051" in " ".join(hc.get("Test") or []), "coordinator: HEALTHCHECK on the gRPC port", str(hc.get("Test")))
    env = dict(e.split("=", 1) for e in images["worker"]["Config"].get("Env") or [])
    c.check(env.get("NVIDIA_DRIVER_CAPABILITIES", "").startswith("compute") and "NVIDIA_VISIBLE_DEVICES" in env,
            "worker: NVIDIA container toolkit variables", f"{env.get('NVIDIA_VISIBLE_DEVICES')} "
            f"{env.get('NVIDIA_DRIVER_CAPABILITIES')}")

    # --- inside them: versions, the user, the libraries ------------------------------------
    for name, program in (("coordinator", "shardline-coordinator"), ("coordinator", "shardctl"),
                          ("worker", "shardline-worker")):
        r = docker("run", "--rm", "--network", "none", "--entrypoint", program, f"shardline/{name}:{version}",
                   "--version", timeout=60)
        c.check(r.returncode == 0 and re.fullmatch(rf"{program} {re.escape(version)} \(\S+\)", r.stdout.strip()),
                f"{name}: {program} --version", (r.stdout + r.stderr).strip()[-300:])
    for name in ("coordinator", "worker"):
        r = docker("run", "--rm", "--network", "none", "--entrypoint", "id", f"shardline/{name}:{version}", timeout=60)
        c.check(r.returncode == 0 and r.stdout.startswith(f"uid={UID}(shardline) gid={UID}(shardline)"),
                f"{name}: runs as shardline ({UID})", r.stdout.strip() or r.stderr.strip())

    # ldd -r inside the worker image: every library and symbol resolved from the wheel's place.
    libs = {"shardline-worker": "/usr/bin/shardline-worker",
            "libtorch_cuda.so": f"{SITE}/torch/lib/libtorch_cuda.so",
            "libtorch_cuda_linalg.so": f"{SITE}/torch/lib/libtorch_cuda_linalg.so",
            "libcudnn_graph.so.9": f"{SITE}/nvidia/cudnn/lib/libcudnn_graph.so.9",
            "libnccl.so.2": f"{SITE}/nvidia/nccl/lib/libnccl.so.2",
            "libcaffe2_nvrtc.so": f"{SITE}/torch/lib/libcaffe2_nvrtc.so"}
    script = "; ".join(f"echo '### {k}'; ldd -r {v} 2>&1 || echo 'ldd failed: {v} not found'" for k, v in libs.items())
    r = docker("run", "--rm", "--network", "none", "--entrypoint", "sh", f"shardline/worker:{version}", "-c", script,
               timeout=120)
    sections = dict(re.findall(r"### (\S+)\n(.*?)(?=### |\Z)", r.stdout, re.S))
    for k in libs:
        out = sections.get(k, "")
        bad = unresolved(out)
        if k == "libcaffe2_nvrtc.so":  # the driver's (cu* symbols): mounted by the NVIDIA container toolkit
            bad = [b for b in bad if not b.startswith("libcuda.so.1 =>")
                   and not re.match(r"undefined symbol: cu[A-Z]\w*\s", b)]
        c.check(out.strip() and not bad, f"worker: ldd -r {k} resolves everything", " ".join(bad)[:500])
    worker_ldd = sections.get("shardline-worker", "")
    for lib, where in (("libtorch_cpu.so", "torch/lib"), ("libc10_cuda.so", "torch/lib"),
                       ("libcudart.so.13", "nvidia/cu13/lib"), ("libnccl.so.2", "nvidia/nccl/lib")):
        m = re.search(rf"{re.escape(lib)} => (\S+)", worker_ldd)
        path = os.path.normpath(m.group(1)) if m else ""
        c.check(path == f"{SITE}/{where}/{lib}", f"worker: {lib} from {SITE}/{where}", path or "absent")
    cuda_ldd = sections.get("libtorch_cuda.so", "")
    for lib in ("libcublas.so.13", "libcudnn.so.9", "libnccl.so.2", "libcusparseLt.so.0", "libnvshmem_host.so.3"):
        c.check(re.search(rf"{re.escape(lib)} => {SITE}/", cuda_ldd.replace("/torch/lib/../../", "/")) is not None,
                f"worker: libtorch_cuda.so finds {lib} in the image")
    # The same check on a container whose libnccl is gone must fail.
    r = docker("run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "sh", f"shardline/worker:{version}",
               "-c", f"rm {SITE}/nvidia/nccl/lib/libnccl.so.2 && ldd -r /usr/bin/shardline-worker", timeout=60)
    c.check(any(b.startswith("libnccl.so.2 => not found") for b in unresolved(r.stdout)),
            "worker: with libnccl removed the check fails", " ".join(unresolved(r.stdout))[:200])
    r = docker("run", "--rm", "--network", "none", "--entrypoint", "sh", f"shardline/coordinator:{version}", "-c",
               "ldd -r /usr/bin/shardline-coordinator && ldd -r /usr/bin/shardctl && "
               f"if test -e {SITE}/torch; then echo HAS-TORCH; fi", timeout=60)
    c.check(r.returncode == 0 and not unresolved(r.stdout) and "HAS-TORCH" not in r.stdout,
            "coordinator: ldd -r resolves everything, no LibTorch",
            f"rc={r.returncode} " + " ".join(unresolved(r.stdout))[:300] + r.stderr[-200:])

    run_job(docker, base, version)


def run_job(docker, base, version):
    """The demo's job, in containers: a coordinator, two CPU workers, shardctl."""
    uid = int(UID)
    shared = os.path.join(base, "shared")
    state = os.path.join(base, "state")
    secrets = {role: os.path.join(base, "secrets-" + role) for role in ("coordinator", "worker", "user")}
    for d in (shared, state, *secrets.values()):
        os.makedirs(d)
        os.chown(d, uid, uid)
    user_token, worker_token = os.urandom(16).hex(), os.urandom(16).hex()
    write_private(os.path.join(secrets["coordinator"], "user-tokens"), user_token + "\n", uid)
    write_private(os.path.join(secrets["coordinator"], "worker-tokens"), worker_token + "\n", uid)
    write_private(os.path.join(secrets["worker"], "worker-token"), worker_token + "\n", uid)
    write_private(os.path.join(secrets["user"], "user-token"), user_token + "\n", uid)
    # The corpus: English text (the demo uses Debian's fortunes; the README is here on every machine).
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    with open(os.path.join(shared, "corpus.txt"), "w") as f:
        f.write(text * max(1, 200000 // len(text)))
    steps = 60
    # examples/tiny-gpt.toml (the demo's job), fewer steps, checkpoints on the shared volume.
    with open(os.path.join(REPO, "examples", "tiny-gpt.toml")) as f:
        job = f.read()
    job = re.sub(r"(?m)^name = .*$", 'name = "docker-gpt"', job)
    job = re.sub(r"(?m)^steps = .*$", f"steps = {steps}", job)
    with open(os.path.join(shared, "fortunes-gpt.toml"), "w") as f:
        f.write(job + '\n[checkpoint]\ndir = "/shared/checkpoints"\ninterval = 30\n')
    for root, dirs, files in os.walk(shared):
        for n in dirs + files:
            os.chown(os.path.join(root, n), uid, uid)

    port, metrics = free_ports(2)
    addr = f"127.0.0.1:{port}"
    coord = f"{PREFIX}-coordinator"
    r = docker("run", "-d", "--name", coord, "--network", "host",
               "--health-cmd", f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'", "--health-interval", "2s",
               "-v", f"{state}:/var/lib/shardline", "-v", f"{shared}:/shared",
               "-v", f"{secrets['coordinator']}:/secrets:ro", "-v", f"{secrets['user']}:/home/user:ro",
               f"shardline/coordinator:{version}",
               "--listen", addr, "--state-dir", "/var/lib/shardline/state", "--metrics-listen", f"127.0.0.1:{metrics}",
               "--token-file", "/secrets/user-tokens", "--worker-token-file", "/secrets/worker-tokens", timeout=60)
    if not c.check(r.returncode == 0, "coordinator container started", r.stderr.strip()[-300:]):
        return
    deadline = time.time() + 60
    logs = ""
    while time.time() < deadline:
        logs = docker("logs", coord, timeout=30).stdout
        if f"listening on {addr}" in logs or docker("inspect", "-f", "{{.State.Running}}", coord).stdout.strip() != "true":
            break
        time.sleep(0.5)
    if not c.check(f"listening on {addr}" in logs, "coordinator: listening", addr if "listening" in logs
                   else docker("logs", coord, timeout=30).stderr[-500:]):
        return
    workers = [f"{PREFIX}-worker-{i}" for i in range(2)]
    for w in workers:
        r = docker("run", "-d", "--name", w, "--network", "host", "-v", f"{shared}:/shared",
                   "-v", f"{secrets['worker']}:/secrets:ro", f"shardline/worker:{version}",
                   "--coordinator", addr, "--device", "cpu", "--threads", "1", "--metrics-port", "0",
                   "--token-file", "/secrets/worker-token", timeout=60)
        c.check(r.returncode == 0, f"{w} started", r.stderr.strip()[-300:])

    def shardctl(*args, timeout=60):
        return docker("exec", coord, "shardctl", "--coordinator", addr, "--token-file", "/home/user/user-token",
                      *args, timeout=timeout)

    deadline = time.time() + 90
    idle = 0
    while time.time() < deadline:
        out = shardctl("workers", timeout=30).stdout
        idle = out.count("IDLE")
        if idle >= 2:
            break
        time.sleep(0.5)
    c.check(idle >= 2, "two workers in containers registered", "" if idle >= 2 else
            "; ".join(docker("logs", w, timeout=30).stderr[-300:] for w in workers))
    if idle < 2:
        return
    t = time.monotonic()
    r = shardctl("submit", "/shared/fortunes-gpt.toml", "--follow", timeout=300)
    log(f"submit --follow: rc={r.returncode} {time.monotonic() - t:.0f} s")
    jobs = json.loads(shardctl("--json", "jobs").stdout or "{}")
    job_list = jobs.get("jobs", jobs) if isinstance(jobs, dict) else jobs
    job_id = job_list[0].get("id") if job_list else None
    st = json.loads(shardctl("status", str(job_id), "--json").stdout or "{}") if job_id else {}
    c.check(r.returncode == 0 and st.get("state") == "SUCCEEDED" and st.get("step") == steps,
            "the demo's job in containers: SUCCEEDED",
            f"{job_id} {st.get('state')} step {st.get('step')}/{steps} loss {st.get('loss')} "
            f"{time.monotonic() - t:.0f} s" + ("" if r.returncode == 0 else " " + (r.stdout + r.stderr)[-500:]))
    manifest = os.path.join(shared, "checkpoints", str(job_id), f"step-{steps:08d}", "manifest.json")
    ranks = [os.path.join(os.path.dirname(manifest), f"rank-{i:05d}.safetensors") for i in range(2)]
    c.check(os.path.exists(manifest) and all(os.path.exists(p) for p in ranks),
            "checkpoint committed on the shared volume", manifest)
    if all(os.path.exists(p) for p in ranks):
        owners = {os.stat(p).st_uid for p in ranks + [manifest]}
        c.check(owners == {uid}, f"checkpoint files owned by uid {UID}", str(owners))
    lines = shardctl("logs", str(job_id)).stdout
    c.check("[rank 0]" in lines and "[rank 1]" in lines, "shardctl logs: both ranks' lines",
            f"{len(lines.splitlines())} lines")
    deadline = time.time() + 30
    health = ""
    while time.time() < deadline:
        health = docker("inspect", "-f", "{{.State.Health.Status}}", coord).stdout.strip()
        if health == "healthy":
            break
        time.sleep(1)
    c.check(health == "healthy", "coordinator: health check healthy", health)
    t = time.monotonic()
    r = docker("stop", "-t", "10", workers[0], timeout=60)
    code = docker("inspect", "-f", "{{.State.ExitCode}}", workers[0]).stdout.strip()
    c.check(r.returncode == 0 and time.monotonic() - t < 9, "worker: docker stop (SIGTERM) ends it",
            f"{time.monotonic() - t:.1f} s, exit {code}")

    # The GPU path where the container sees no GPU (no --gpus): the worker image's CUDA runtime
    # answers, and a cuda:0 worker refuses to start, naming the device, not a library.
    docker("stop", "-t", "10", workers[1], timeout=60)
    gpu = f"{PREFIX}-worker-gpu"
    t = time.monotonic()
    r = docker("run", "-d", "--name", gpu, "--network", "host", "-v", f"{shared}:/shared",
               "-v", f"{secrets['worker']}:/secrets:ro", f"shardline/worker:{version}",
               "--coordinator", addr, "--device", "cuda:0", "--metrics-port", "0",
               "--token-file", "/secrets/worker-token", timeout=60)
    code = docker("wait", gpu, timeout=60).stdout.strip() if r.returncode == 0 else ""
    logs = docker("logs", gpu, timeout=30).stderr if r.returncode == 0 else r.stderr
    c.check(code == "2" and "device cuda:0: not visible (this process sees 0 CUDA devices)" in logs
            and "cannot load" not in logs and "cuda:0" not in shardctl("workers", timeout=30).stdout,
            "worker --device cuda:0 without a GPU: refuses to start, naming the device",
            f"exit {code} in {time.monotonic() - t:.0f} s: {logs.strip()[-300:]}")

if __name__ == "__main__":
    main()
