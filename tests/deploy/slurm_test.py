#!/usr/bin/env python3
"""deploy/slurm: the sbatch script on a real single-host Slurm cluster.

The test starts the cluster itself, everything private to a scratch
directory: munged on its own socket and key, then slurmctld -D and slurmd -D
from a generated slurm.conf (this host as the one node, with its real CPUs and
memory, two file-backed GPUs as gres so that --gpus-per-node works, free ports,
its own state, spool and pid files, accounting off, the final job state read
with `scontrol show job`). Then it sbatch's deploy/slurm/shardline.sbatch:

  1. a tiny GPT on text, SHARDLINE_DEVICE=cpu with --gpus-per-node=2 (one worker
     per GPU: 2), user and worker tokens, SHARDLINE_CHECKPOINT_DIR: the Slurm
     job ends COMPLETED 0:0, the script says the Shardline job SUCCEEDED, the
     steps were stopped by SIGTERM to their tasks (not Slurm's SIGKILL), and the
     checkpoints and rank 0's history.jsonl are in the directory given, not in
     the job file's own [checkpoint] dir;
  2. the same job with the default device: worker i is bound to cuda:i
     ($SLURM_LOCALID), which this GPU-less host does not have, so the Shardline
     job FAILS and the Slurm job ends FAILED with a non-zero exit code;
  3. a long job on a node without GPUs (--gpus-per-node=0,
     SHARDLINE_WORKERS_PER_NODE=2): SIGUSR1 to the batch shell (what
     --signal=B:USR1@300 sends before the time limit) has it saved, then
     scancel while it runs: CANCELLED, and no coordinator or worker left;
  4. SHARDLINE_RESUME=job-1 on the same SHARDLINE_STATE_DIR in a new
     allocation: job-1 (left RUNNING by the scancel) is cancelled first and
     resumed from the saved checkpoint.

Also `bash -n` and shellcheck on the script. Every wait has a
deadline and the daemons are stopped at the end, also on failure.

    python3 tests/deploy/slurm_test.py        (ctest -L deploy: deploy_slurm)
"""
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
SCRIPT = os.path.join(REPO, "deploy", "slurm", "shardline.sbatch")
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from harness import BUILD, Checks, free_ports  # noqa: E402

BUILD = os.path.abspath(BUILD)
PROGRAMS = [os.path.join(BUILD, d, p) for d, p in (("server", "shardline-coordinator"),
                                                    ("worker", "shardline-worker"), ("client", "shardctl"))]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}

JOB = """[job]
name = "{name}"
workers = 2

[model]
n_layer = 2
n_head = 4
n_embd = 32
vocab_size = 256          # bytes
block_size = 16

[data]
format = "text"
path = "corpus.txt"

[train]
steps = {steps}
batch_size = 8
micro_batch_size = 4

[optimizer]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2

[parallelism]
strategy = "full_shard"
{checkpoint}"""


def wait_for(pred, timeout, step=0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-n:])
    except OSError:
        return f"({path} unreadable)"


class Cluster:
    """munged, slurmctld and slurmd for one node (this host), in `base`."""

    def __init__(self, base):
        self.base = base
        self.procs = []
        self.conf = os.path.join(base, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def start(self):
        b = self.base
        os.chmod(b, 0o755)  # munged wants its socket's directory searchable by all
        for d in ("state", "spool", "log"):
            os.makedirs(os.path.join(b, d))
        key = os.path.join(b, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_bytes(1024))
        os.close(fd)
        self.socket = os.path.join(b, "munge.sock")
        self.spawn("munged", ["munged", "-F", "--socket", self.socket, "--key-file", key,
                              "--pid-file", os.path.join(b, "munged.pid"), "--seed-file", os.path.join(b, "munged.seed"),
                              "--log-file", os.path.join(b, "log", "munged.log")])
        if not wait_for(lambda: subprocess.run(["munge", "-n", "-S", self.socket], capture_output=True,
                                               timeout=10).returncode == 0, 20):
            raise RuntimeError("munged did not start: " + tail(os.path.join(b, "log", "munged.out")))

        # This host as slurmd sees it: its name, CPUs and memory.
        r = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30)
        fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
        node = fields.get("NodeName") or socket.gethostname().split(".")[0]
        cpus = max(int(fields.get("CPUs", os.cpu_count() or 1)), 2)
        memory = max(int(int(fields.get("RealMemory", 4096)) * 0.9), 1024)
        self.node = node
        ctld_port, slurmd_port = free_ports(2)
        gpus = []
        for i in range(2):  # file-backed stand-ins: gres counts them, nothing opens them
            gpus.append(os.path.join(b, f"gpu{i}"))
            open(gpus[-1], "w").close()
        with open(os.path.join(b, "gres.conf"), "w") as f:
            f.write(f"AutoDetect=off\nNodeName={node} Name=gpu File={b}/gpu[0-1]\n")
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=shardline-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=20
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} Sockets=1 CoresPerSocket={cpus} ThreadsPerCore=1 \
RealMemory={memory} Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
        self.spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self.spawn("slurmd", ["slurmd", "-D", "-N", node])

        def idle():
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=10,
                               env=self.env)
            return r.returncode == 0 and r.stdout.strip() == "idle"
        if not wait_for(idle, 60, 1):
            raise RuntimeError("the node did not become idle: " + tail(os.path.join(b, "log", "slurmctld.log")) +
                               "\n" + tail(os.path.join(b, "log", "slurmd.log")))
        return self

    def spawn(self, name, argv):
        out = open(os.path.join(self.base, "log", f"{name}.out"), "w")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        out.close()
        self.procs.append((name, p))

    def sbatch(self, args, env):
        r = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=60,
                           env=dict(self.env, **env))
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id):
        """{key: value} of `scontrol show job -o`."""
        r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20,
                           env=self.env)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout)) if r.returncode == 0 else {}

    def wait_while_running(self, job_id, pred, timeout):
        """pred()'s first true value while the Slurm job has not ended; RuntimeError once it has."""
        def step():
            v = pred()
            if v:
                return v
            if self.job(job_id).get("JobState") in FINAL:
                raise RuntimeError(f"Slurm job {job_id} ended early: {self.job(job_id).get('JobState')}")
            return None
        return wait_for(step, timeout)

    def wait_end(self, job_id, timeout):
        j = wait_for(lambda: (lambda j: j if j.get("JobState") in FINAL else None)(self.job(job_id)), timeout, 1)
        return j or self.job(job_id)

    def leftovers(self):
        """Our processes other than the daemons: anything whose environment names our slurm.conf."""
        mine = {str(p.pid) for _, p in self.procs} | {str(os.getpid())}
        found = []
        needle = ("SLURM_CONF=" + self.conf).encode() + b"\0"
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if pid in mine:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if needle not in f.read():
                        continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append((int(pid), f.read().replace(b"\0", b" ").decode(errors="replace").strip()))
            except OSError:
                pass
        return found

    def steps_left(self):
        """Programs of jobs still running: the batch script, slurmstepd, Shardline's."""
        return [p for p in self.leftovers() if re.search(r"slurm_script|slurmstepd|shardline-|shardctl", p[1])]

    def stop(self):
        try:
            subprocess.run(["scancel", f"--nodelist={self.node}"], capture_output=True, timeout=20, env=self.env)
            wait_for(lambda: not self.steps_left(), 30, 1)
        except Exception:  # noqa: BLE001 - the daemons are stopped below whatever happened
            pass
        for name, p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for pid, _ in self.leftovers():  # job steps that outlived slurmd
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def write_secret(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def check_static(checks):
    r = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True, timeout=30)
    checks.check(r.returncode == 0, "bash -n shardline.sbatch", r.stderr.strip())
    # shellcheck comes with tests/deps.sh; without it this check fails rather than skips.
    r = subprocess.run(["shellcheck", SCRIPT], capture_output=True, text=True, timeout=60) \
        if shutil.which("shellcheck") else subprocess.CompletedProcess([], 1, "shellcheck is not installed", "")
    checks.check(r.returncode == 0, "shellcheck shardline.sbatch", r.stdout.strip()[-800:])
    text = read(SCRIPT)
    headers = dict(re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", text, re.M))
    checks.check(all(k in headers for k in ("nodes", "ntasks-per-node", "gpus-per-node", "time")),
                 "#SBATCH headers for nodes, tasks and GPUs per node, time", str(headers))
    checks.check(headers.get("ntasks-per-node") == headers.get("gpus-per-node"),
                 "#SBATCH --ntasks-per-node equals --gpus-per-node (one worker per GPU)")


def main():
    checks = Checks()
    check_static(checks)
    if not checks.check(os.geteuid() == 0, "running as root (slurmd runs jobs as their users)"):
        checks.finish()
    missing = [t for t in ("munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
               if not shutil.which(t)]
    if not checks.check(not missing, "Slurm and munge are installed (Debian slurm-wlm, munge)", " ".join(missing)):
        checks.finish()
    unbuilt = [p for p in PROGRAMS if not os.access(p, os.X_OK)]
    if not checks.check(not unbuilt, "the programs are built", " ".join(unbuilt)):
        checks.finish()

    base = tempfile.mkdtemp(prefix="shardline-slurm-")
    cluster = Cluster(os.path.join(base, "slurm"))
    os.makedirs(cluster.base)
    os.chmod(base, 0o755)  # munged wants every directory above its socket searchable
    t0 = time.time()
    try:
        cluster.start()
        checks.check(True, f"single-host Slurm up: node {cluster.node} idle", f"{time.time() - t0:.1f}s")
        work = os.path.join(base, "work")
        os.makedirs(work)
        with open(os.path.join(REPO, "README.md"), errors="replace") as f:
            corpus = f.read()[:40000]
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write(corpus)
        # tiny's own [checkpoint] dir is what SHARDLINE_CHECKPOINT_DIR replaces.
        for name, steps, ck in (("tiny", 20, '\n[checkpoint]\ndir = "ckpt-local"   # replaced\ninterval = 10\n'),
                                ("long", 1000000, "")):
            with open(os.path.join(work, f"{name}.toml"), "w") as f:
                f.write(JOB.format(name=name, steps=steps, checkpoint=ck))
        user_token, worker_token = secrets.token_hex(32), secrets.token_hex(32)
        write_secret(os.path.join(work, "user-token"), user_token)
        write_secret(os.path.join(work, "worker-token"), worker_token)
        env = {"SHARDLINE_BUILD": BUILD, "SHARDLINE_COORDINATOR_ARGS": "--metrics-port 0",
               "SHARDLINE_START_TIMEOUT": "60"}
        tokens = {"SHARDLINE_TOKEN_FILE": os.path.join(work, "user-token"),
                  "SHARDLINE_WORKER_TOKEN_FILE": os.path.join(work, "worker-token")}
        try:  # workers dial the first node's hostname; a host whose name does not resolve gets the loopback
            socket.gethostbyname(socket.gethostname())
        except OSError:
            env["SHARDLINE_COORDINATOR_HOST"] = "127.0.0.1"
        common = ["--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=5",
                  "--signal=B:USR1@30",  # the header's @300 would come at once within --time=5
                  f"--chdir={work}"]

        # 1. Success.
        t = time.time()
        ckpt = os.path.join(base, "shared", "checkpoints")
        jid = cluster.sbatch(common + ["--gpus-per-node=2", f"--output={work}/ok-%j.out", SCRIPT, "tiny.toml"],
                             dict(env, SHARDLINE_DEVICE="cpu", SHARDLINE_CHECKPOINT_DIR=ckpt, **tokens))
        j = cluster.wait_end(jid, 120)
        out = read(os.path.join(work, f"ok-{jid}.out"))
        print("".join("    | " + l + "\n" for l in out.splitlines()), end="")
        ok = j.get("JobState") == "COMPLETED" and j.get("ExitCode") == "0:0"
        checks.check(ok, "a job that succeeds: the Slurm job is COMPLETED with exit code 0:0",
                     f"{j.get('JobState')} {j.get('ExitCode')} in {time.time() - t:.1f}s"
                     + ("" if ok else "\n" + out[-3000:]))
        m = re.search(r"^shardline-slurm: (job-\S+) SUCCEEDED$", out, re.M)
        checks.check(m is not None, "the script's output: the Shardline job SUCCEEDED")
        shardline_job = m.group(1) if m else "job-1"
        devices = sorted(re.findall(r"^worker (\d+) on \S+: --device (\S+)$",
                                    "".join(read(os.path.join(work, f"shardline-{jid}", n))
                                            for n in sorted(os.listdir(os.path.join(work, f"shardline-{jid}")))
                                            if n.startswith("worker-")), re.M))
        checks.check(devices == [("0", "cpu"), ("1", "cpu")],
                     "one worker per allocated GPU (2), SHARDLINE_DEVICE=cpu", str(devices))
        idle = re.findall(r"^w-\d+\s+\S+\s+cpu\s+IDLE", out, re.M)
        checks.check(len(idle) == 2, "both workers registered IDLE before the submission", str(idle))
        history = os.path.join(ckpt, shardline_job, "history.jsonl")
        n = len(read(history).splitlines())
        checks.check(n == 20, "rank 0's history.jsonl is in SHARDLINE_CHECKPOINT_DIR", f"{history}: {n} lines")
        steps = sorted(d for d in os.listdir(os.path.join(ckpt, shardline_job)) if d.startswith("step-")) \
            if os.path.isdir(os.path.join(ckpt, shardline_job)) else []
        checks.check(steps == ["step-00000010", "step-00000020"] and not os.path.exists(os.path.join(work, "ckpt-local")),
                     "SHARDLINE_CHECKPOINT_DIR replaces the job file's [checkpoint] dir, keeping its interval",
                     str(steps))
        checks.check(not [f for f in os.listdir(work) if f.startswith(".tiny.")],
                     "the job file's copy with the checkpoint dir is removed")
        gone = wait_for(lambda: not cluster.steps_left(), 30)
        checks.check(gone, "no coordinator or worker left after the Slurm job", str(cluster.steps_left()))
        coordinator_log = read(os.path.join(work, f"shardline-{jid}", "coordinator.log"))
        forced = re.findall(r"^srun: .*(?:Killed|forcing job termination|error).*$", out, re.M)
        checks.check("coordinator_stopping signal=15" in coordinator_log and not forced,
                     "the steps end by SIGTERM to their tasks (the programs' own stop, not Slurm's SIGKILL)",
                     " | ".join(forced[:3]))

        # 2. Failure: the default device binds worker i to cuda:i, absent here.
        t = time.time()
        jid = cluster.sbatch(common + ["--gpus-per-node=2", f"--output={work}/fail-%j.out", SCRIPT, "tiny.toml"], env)
        j = cluster.wait_end(jid, 120)
        out = read(os.path.join(work, f"fail-{jid}.out"))
        ok = j.get("JobState") == "FAILED" and j.get("ExitCode", "0:0") != "0:0"
        checks.check(ok, "a job that fails: the Slurm job is FAILED with a non-zero exit code",
                     f"{j.get('JobState')} {j.get('ExitCode')} in {time.time() - t:.1f}s"
                     + ("" if ok else "\n" + out[-3000:]))
        refused = sorted(set(re.findall(r"device (cuda:\d+): not visible \(this process sees 0 CUDA devices\)", out)))
        checks.check("a step exited while waiting for" in out and refused == ["cuda:0", "cuda:1"],
                     "the script's output: each worker refused to start, naming its device",
                     str(refused) + " " + (re.findall(r".*(?:not visible|step exited).*", out) or [""])[0][:200])
        bound = sorted(set(re.findall(r"^worker \d+ on \S+: --device (cuda:\d+)$", out, re.M)))
        checks.check(bound == ["cuda:0", "cuda:1"], "the default device: worker i on cuda:$SLURM_LOCALID", str(bound))

        # 3. A long job on a node without GPUs (--gpus-per-node=0, SHARDLINE_WORKERS_PER_NODE):
        # USR1 (as --signal=B:USR1@300 sends it before the time limit) saves a
        # checkpoint, then scancel while it runs.
        t = time.time()
        state = os.path.join(base, "shared", "state")
        nogpu = dict(env, SHARDLINE_DEVICE="cpu", SHARDLINE_WORKERS_PER_NODE="2", SHARDLINE_STATE_DIR=state, **tokens)
        jid = cluster.sbatch(common + ["--gpus-per-node=0", f"--output={work}/cancel-%j.out", SCRIPT, "long.toml"], nogpu)
        out_path = os.path.join(work, f"cancel-{jid}.out")
        try:
            address = cluster.wait_while_running(jid, lambda: re.search(r"coordinator on (\S+) ", read(out_path)), 90)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{read(out_path)[-2000:]}")
        address = address.group(1) if address else "127.0.0.1:1"

        def ctl(*args, token=True):
            cmd = [PROGRAMS[2], "--coordinator", address]
            if token:
                cmd += ["--token-file", tokens["SHARDLINE_TOKEN_FILE"]]
            return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=20)

        def running(job, first=1):
            def pred():
                r = ctl("--json", "status", job)
                m = re.search(r'"state":"RUNNING","step":(\d+)', r.stdout)
                return m and int(m.group(1)) >= first and int(m.group(1))
            return pred
        started = cluster.wait_while_running(jid, running("job-1"), 90)
        checks.check(bool(started), "a long job runs under the script", "" if started else read(out_path)[-2000:])
        if not started:
            raise RuntimeError("the long job did not start")
        r = ctl("workers", token=False)
        checks.check(r.returncode != 0 and re.search(r"unauthenticated|token", r.stderr, re.I),
                     "the coordinator wants the user token (SHARDLINE_TOKEN_FILE)", r.stderr.strip()[:150])
        subprocess.run(["scancel", "--signal=USR1", "--batch", jid], check=True, timeout=20, env=cluster.env)

        def saved():
            r = ctl("--json", "ckpt", "list", "job-1")
            found = re.findall(r'"step":(\d+),"path":"([^"]*)"', r.stdout)
            return found and found[-1]
        ckpt = wait_for(saved, 60)
        checks.check(bool(ckpt) and "USR1: asking job-1 for a checkpoint" in read(out_path),
                     "USR1 (--signal=B:USR1@300): the script has the job save a checkpoint", str(ckpt))
        checks.check(bool(wait_for(running("job-1", int(ckpt[0]) + 1 if ckpt else 1), 30)),
                     "the job goes on after the save")
        subprocess.run(["scancel", jid], check=True, timeout=20, env=cluster.env)
        j = cluster.wait_end(jid, 90)
        checks.check(j.get("JobState") == "CANCELLED", "scancel: the Slurm job is CANCELLED",
                     f"{j.get('JobState')} {j.get('ExitCode')}")
        gone = wait_for(lambda: not cluster.steps_left(), 40)
        out = read(out_path)
        checks.check(bool(gone), "scancel: the coordinator and the workers stopped",
                     f"in {time.time() - t:.1f}s" if gone else str(cluster.steps_left()) + "\n" + out[-2000:])
        checks.check("interrupted" in out, "scancel: the script's trap ran", out.splitlines()[-1] if out else "")

        # 4. SHARDLINE_RESUME in a new allocation, on the same state directory.
        if ckpt:
            t = time.time()
            jid = cluster.sbatch(common + ["--gpus-per-node=0", f"--output={work}/resume-%j.out", SCRIPT],
                                 dict(nogpu, SHARDLINE_RESUME="job-1"))
            out_path = os.path.join(work, f"resume-{jid}.out")
            line = f"resuming from {ckpt[1]}"
            try:
                resumed = cluster.wait_while_running(
                    jid, lambda: "resumed job-1 as job-2" in read(out_path) and line in read(out_path), 90)
            except RuntimeError:
                resumed = None
            by_trap = "cancelling job-1" in read(os.path.join(work, f"cancel-{int(jid) - 1}.out"))
            first = "job-1 is still recorded as running: cancelling it first" in read(out_path)
            checks.check(by_trap or first, "job-1 is not left running: cancelled by the scancelled run's trap or"
                         " before the resume", "by the trap" if by_trap else "before the resume")
            checks.check(bool(resumed), "SHARDLINE_RESUME: a new allocation resumes job-1 from its checkpoint",
                         line if resumed else read(out_path)[-2000:])
            subprocess.run(["scancel", jid], check=True, timeout=20, env=cluster.env)
            j = cluster.wait_end(jid, 90)
            checks.check(j.get("JobState") == "CANCELLED" and wait_for(lambda: not cluster.steps_left(), 40),
                         "scancel of the resumed run: CANCELLED, nothing left", f"{time.time() - t:.1f}s")
    except Exception as e:  # noqa: BLE001 - reported as a failure, the cluster is stopped below
        checks.check(False, "the Slurm run", f"{type(e).__name__}: {e}")
    finally:
        cluster.stop()
        left = cluster.leftovers()
        checks.check(not left and all(p.poll() is not None for _, p in cluster.procs),
                     "munged, slurmctld, slurmd and every step stopped", str(left))
        print(f"total {time.time() - t0:.1f}s")
        checks.remove_unless_failed(base)
    checks.finish()


if __name__ == "__main__":
    main()
