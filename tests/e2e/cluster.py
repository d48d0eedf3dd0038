"""A local Shardline cluster of real processes on loopback for end-to-end
tests: the coordinator, workers and shardctl, all the built binaries. Every
wait has a deadline; everything started is killed at exit."""
import atexit
import json
import os
import re
import signal
import subprocess
import sys
import time

BUILD = os.environ.get("SHARDLINE_BUILD", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
COORDINATOR = os.path.join(BUILD, "server", "shardline-coordinator")
WORKER = os.path.join(BUILD, "worker", "shardline-worker")
SHARDCTL = os.path.join(BUILD, "client", "shardctl")
_procs = []

# One pass/fail reporter for every test script (the closing line ctest reads).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from harness import Checks, free_port, scratch_dir  # noqa: E402,F401


def _cleanup():
    for p in _procs:
        if p.poll() is None:
            p.kill()
            p.wait()


atexit.register(_cleanup)

JOB = """
[job]
name = "{name}"
workers = {workers}
{job_keys}
[model]
n_layer = 2
n_head = 4
n_embd = 32
vocab_size = 64
block_size = 16
[data]
format = "synthetic"
[train]
steps = {steps}
batch_size = 12
micro_batch_size = {micro}
eval_interval = {eval_interval}
{train_keys}
[optimizer]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
[parallelism]
strategy = "{strategy}"
"""


def job_file(directory, name="tiny", workers=2, steps=20, strategy="full_shard", extra="", micro=None,
             eval_interval=0, restarts=None, job_keys="", train_keys=""):
    """restarts: [job] max_restarts (None: the default, 3); job_keys and
    train_keys: more lines for the [job] table (min_workers = 2, ...) and the
    [train] table."""
    path = os.path.join(directory, f"{name}.toml")
    if restarts is not None:
        job_keys += f"\nmax_restarts = {restarts}"
    with open(path, "w") as f:
        f.write(JOB.format(name=name, workers=workers, steps=steps, strategy=strategy, job_keys=job_keys,
                           micro=micro or (12 // workers // 2 or 1), eval_interval=eval_interval,
                           train_keys=train_keys) + extra)
    return path


def rss_mib(pid):
    """A process's resident memory now, in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wait_for(pred, timeout, what, fail=True):
    """pred()'s first true value within `timeout` seconds; then TimeoutError,
    or False with fail=False (for a check to report)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    if not fail:
        return False
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


class Cluster:
    def __init__(self, token=None, coordinator_args=(), worker_token=None):
        """token: the users' (shardctl); worker_token: the workers' (without
        it, workers use the users' token)."""
        self.coordinator_args = list(coordinator_args)
        self.dir = scratch_dir("shardline-e2e-")
        self.state = os.path.join(self.dir, "state")
        self.token_file = self.secret_file("token", token) if token else None
        self.worker_token_file = self.secret_file("worker-token", worker_token) if worker_token else None
        self.workers = {}
        self.port = 0
        self.coordinator_log_path = os.path.join(self.dir, "coordinator.log")
        self.start_coordinator()

    def coordinator_log(self):
        """The coordinator's stderr so far, over all its starts."""
        with open(self.coordinator_log_path) as f:
            return f.read()

    def secret_file(self, name, text, mode=0o600):
        """A file under the cluster's directory holding `text` and a newline."""
        path = os.path.join(self.dir, name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
            f.write(text + "\n")
        os.chmod(path, mode)
        return path

    def start_coordinator(self):
        args = [COORDINATOR, "--listen", f"127.0.0.1:{self.port}", "--state-dir", self.state, "--heartbeat-ms", "500"]
        args += self.coordinator_args
        if self.token_file:
            args += ["--token-file", self.token_file]
        if self.worker_token_file:
            args += ["--worker-token-file", self.worker_token_file]
        # Its log (stderr) in a file, every start appended: a pipe nobody
        # reads would fill.
        with open(self.coordinator_log_path, "a") as log:
            self.coordinator = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        _procs.append(self.coordinator)
        line = self.coordinator.stdout.readline()
        m = re.match(r"listening on (\S+):(\d+)", line)
        if not m:
            self.coordinator.wait(timeout=10)
            raise RuntimeError(f"coordinator did not start: {line} {self.coordinator_log()[-500:]}")
        self.port = int(m.group(2))
        self.address = f"127.0.0.1:{self.port}"

    def add_worker(self, host, env=None, args=(), collective_timeout=10, device="cpu", name=None):
        """A worker on `host`; `name` (default: the host) keys self.workers and its log, for several on a host."""
        args = [WORKER, "--coordinator", self.address, "--device", device, "--host", host,
                "--collective-timeout", str(collective_timeout)] + list(args)
        if self.worker_token_file or self.token_file:
            args += ["--token-file", self.worker_token_file or self.token_file]
        log = open(os.path.join(self.dir, f"worker-{name or host}.log"), "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
        _procs.append(p)
        self.workers[name or host] = p
        return p

    def ctl(self, *args, token=True, timeout=60):
        cmd = [SHARDCTL, "--coordinator", self.address]
        if token and self.token_file:
            cmd += ["--token-file", self.token_file]
        r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def ctl_json(self, *args):
        rc, out, err = self.ctl("--json", *args)
        if rc != 0:
            raise RuntimeError(f"shardctl {' '.join(args)} failed: {err.strip()}")
        return json.loads(out)

    def job(self, job_id):
        return self.ctl_json("status", job_id)

    def idle_workers(self):
        return [w for w in self.ctl_json("workers")["workers"] if w["state"] == "IDLE"]

    def wait_workers(self, n, timeout=20):
        return wait_for(lambda: len(self.idle_workers()) >= n, timeout, f"{n} idle workers")

    def kill_coordinator(self):
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait()
