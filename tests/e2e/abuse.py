"""A hostile client built from the proto (tests/e2e/store_abuse.cc) holds a
real rank of a job of its own: a valid worker token and a valid rank
credential.

Store pressure: rounds of 1 MiB values until the store refuses one (its
per-job limit), deleted again, then 1000 waits given up after 100 ms. The
store refuses past the limit every round, every abandoned wait is freed
before the next round (none is refused for too many pending waits), and the
coordinator's resident memory, sampled before the first round, in the middle
of each (the job's store at its limit) and after each, stays flat: over five
rounds, once the heap has settled (eight rounds first), each middle within
20% of the first middle and each end within 20% of the end before them, with
the coordinator as shipped (it limits and trims malloc's arenas).

Authority: while a victim job runs on two real workers, the hostile client
is refused (PERMISSION_DENIED, and shardline_coordinator_refused_total{what}
rises) for ReportCheckpoint of the victim's rank with no credential and with
its own rank's credential, and of its own rank's file named outside its step
directory; StoreGet and StoreSet of the victim's keys with its credential,
without one and with a user token. A second worker session sends Progress and
RankFinished for the victim's ranks: ignored and counted, the victim stays
RUNNING at its own step and is still cancelled.

Ownership and roles: a job records the SHA-256 of the token that submitted it
(never the token); another user's token cannot cancel or delete it
(PERMISSION_DENIED naming the job, counted as "owner"), nor can a worker
token; once the owner's token is rotated out any user may. A job submitted
without authentication has no owner. Another user's token cannot read its
status, logs, checkpoints or shards, nor resume from its checkpoint (by path or
through a symlink), but sees it in `jobs`. As a second user: a step directory
planted as a symlink to the victim's committed step is refused by the workers
and the victim's files are unchanged; a config.json that is a FIFO or
/dev/zero is refused at once naming it. A worker whose host holds terminal
escapes or is 3 MiB long is refused at registration, and `workers` still
serves. A ListJobs page token near 2^64 is past the end. --token-file without
--worker-token-file (or --shared-token) stops the coordinator at start."""
import hashlib
import json
import os
import select
import signal
import subprocess
import time
import urllib.request

from cluster import BUILD, COORDINATOR, Checks, Cluster, job_file, rss_mib, wait_for

ABUSER = os.path.join(BUILD, "tests", "store_abuse")
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8


class Abuser:
    """The hostile client: one command, one answer line, each within a deadline."""

    def __init__(self, address, worker_token_file, user_token_file):
        self.p = subprocess.Popen([ABUSER, address, worker_token_file, user_token_file], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buf = b""

    def line(self, timeout=60):
        deadline = time.time() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                raise TimeoutError(f"the abuser said nothing for {timeout}s")
            chunk = os.read(self.p.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the abuser exited: {self.p.stderr.read().decode().strip()[-300:]}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def ask(self, command, timeout=60):
        self.p.stdin.write((command + "\n").encode())
        self.p.stdin.flush()
        return self.line(timeout)

    def call(self, command):
        """(gRPC code, message) of a command that makes one call."""
        words = self.ask(command).split(" ", 2)
        if words[0] != "status":
            raise RuntimeError(f"{command}: {' '.join(words)}")
        return int(words[1]), words[2] if len(words) > 2 else ""

    def quit(self):
        self.p.stdin.write(b"quit\n")
        self.p.stdin.close()
        self.p.wait(timeout=30)


def refused(port):
    """shardline_coordinator_refused_total by its `what` label."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith("shardline_coordinator_refused_total{"):
            what = line.split('what="', 1)[1].split('"', 1)[0]
            out[what] = float(line.split()[-1])
    return out


WARMUP_ROUNDS, MEASURED_ROUNDS = 8, 5


def store_pressure(c, cl, ab):
    """Rounds of abuse with the coordinator's RSS sampled before the first,
    in the middle of each (the job's store at its limit) and after each."""
    before = rss_mib(cl.coordinator.pid)
    rounds, during, after = [], [], []
    for r in range(WARMUP_ROUNDS + MEASURED_ROUNDS):
        filled = ab.ask("fill").split()  # filled set S refused CODE
        # Each sample after the coordinator's next malloc_trim (once a
        # second): what it holds, not what malloc has yet to give back.
        time.sleep(1.2)
        during.append(rss_mib(cl.coordinator.pid))
        ab.ask("empty")
        waits = ab.ask("waits").split()  # waits 1000 refused R
        time.sleep(1.2)  # the coordinator's tick frees abandoned waits, then trims
        after.append(rss_mib(cl.coordinator.pid))
        rounds.append((int(filled[2]), int(filled[4]), int(waits[3])))
    # 8 MiB per job: eight values of just under 1 MiB fit, the ninth is refused.
    c.check(all(s == 8 and code == RESOURCE_EXHAUSTED for s, code, _ in rounds),
            "each round the job's values fit up to its limit and the next is refused", str(rounds))
    c.check(all(w == 0 for _, _, w in rounds), "abandoned waits are freed: none refused in later rounds",
            str([w for _, _, w in rounds]))
    # The heap's first rounds place the values and the waits' buffers (RSS
    # climbs, then stays). The references: the middle of the first round
    # after them (the job's store at its limit) and the end of the last of
    # them; every later middle and end stays within 20% of its reference.
    w = WARMUP_ROUNDS
    ref_during, ref_after = during[w], after[w - 1]
    fmt = lambda vs: " ".join(f"{v:.1f}" for v in vs)  # noqa: E731
    print(f"coordinator RSS (MiB): before {before:.1f}; warm-up rounds during {fmt(during[:w])} "
          f"after {fmt(after[:w])}; measured rounds during {fmt(during[w:])} after {fmt(after[w:])}; "
          f"references {ref_during:.1f} (during), {ref_after:.1f} (after)", flush=True)
    c.check(before <= ref_after and all(abs(v - ref_during) <= 0.2 * ref_during for v in during[w:])
            and all(abs(v - ref_after) <= 0.2 * ref_after for v in after[w:]),
            f"the coordinator's memory stays flat over {MEASURED_ROUNDS} rounds: each middle within 20% of "
            f"{ref_during:.1f} MiB, each end within 20% of {ref_after:.1f} MiB",
            f"during {min(during[w:]):.1f}..{max(during[w:]):.1f}, after {min(after[w:]):.1f}..{max(after[w:]):.1f}")


def authority(c, cl, ab, own, port):
    """The hostile client against a victim running on real workers."""
    cl.add_worker("host-a")
    cl.add_worker("host-b")
    cl.wait_workers(2)
    ckpt = '\n[checkpoint]\ndir = "ckpt"\ninterval = 5\nkeep_latest = 0\n'
    victim = cl.ctl_json("submit", job_file(cl.dir, "victim", workers=2, steps=1000000, extra=ckpt))["job_id"]
    wait_for(lambda: cl.job(victim)["state"] == "RUNNING" and cl.job(victim)["step"] >= 6, 60,
             "the victim running past its first checkpoint")
    vroot = ab.ask(f"job {victim}").split()[3]  # job STATE OWNER ROOT
    oroot = ab.ask(f"job {own}").split()[3]

    def refused_call(command, what, name):
        before = refused(port).get(what, 0)
        code, msg = ab.call(command)
        rose = wait_for(lambda: refused(port).get(what, 0) > before, 10, f"refused{{{what}}}", fail=False)
        c.check(code == PERMISSION_DENIED and rose, f"{name}: PERMISSION_DENIED, counted as {what}",
                f"code {code}: {msg}")
        return msg

    rank0 = f"{vroot}/step-00000005/rank-00000.safetensors"
    msg = refused_call(f"report {victim} 0 5 {rank0} -", "checkpoint_report",
                       "ReportCheckpoint of the victim's rank without a credential")
    c.check(f"job {victim} rank 0" in msg, "... naming the job and rank", msg)
    refused_call(f"report {victim} 0 5 {rank0} own", "checkpoint_report",
                 "ReportCheckpoint of the victim's rank with another rank's credential")
    for outside in ("/tmp/elsewhere/rank-00000.safetensors",
                    f"{oroot}/step-00000005/../../../elsewhere/step-00000005/rank-00000.safetensors",
                    f"{vroot}/step-00000005/rank-00000.safetensors"):
        refused_call(f"report {own} 0 5 {outside} own", "checkpoint_report",
                     f"ReportCheckpoint of its own rank naming {outside}")
    c.check(not os.path.exists("/tmp/elsewhere"), "nothing was written outside the step directories")

    key = f"{victim}/gloo/rank_0"
    for op in ("get", "set"):
        call = f"Store{op.title()} of the victim's key"
        refused_call(f"store {op} {key} own worker", "store", f"{call} with its own rank's credential")
        refused_call(f"store {op} {key} - worker", "store", f"{call} without a credential")
        refused_call(f"store {op} {key} own user", "role", f"{call} with a user token")

    step_before = cl.job(victim)["step"]
    for what, commands in (("progress", [f"progress {victim} 0 999999", f"progress {victim} 1 999999"]),
                           ("finished", [f"finished {victim} 0", f"finished {victim} 1"])):
        before = refused(port).get(what, 0)
        answers = [ab.ask(cmd) for cmd in commands]
        rose = wait_for(lambda: refused(port).get(what, 0) >= before + 2, 10, f"refused{{{what}}}", fail=False)
        c.check(answers == ["sent", "sent"] and rose,
                f"a second session's {what.title()} for both of the victim's ranks: ignored and counted", str(answers))
    time.sleep(1)
    j = cl.job(victim)
    c.check(j["state"] == "RUNNING" and step_before <= j["step"] < 999999,
            "the victim stays RUNNING at its own step", f"{j['state']} step {j['step']}: {j['message']}")

    # A session that says it still runs the victim's rank 1, without that
    # rank's credential: told to stop, counted, and tied to no job (the
    # victim's delete below is not held up by it).
    before = refused(port).get("claim", 0)
    answer = ab.ask(f"claim {victim} 1")
    rose = wait_for(lambda: refused(port).get("claim", 0) > before, 10, "refused{claim}", fail=False)
    rogue = wait_for(lambda: [w for w in cl.ctl_json("workers")["workers"] if w["host"] == "hostile-claim"], 10,
                     "the claimant registered", fail=False)
    c.check(answer == "sent" and rose and rogue and rogue[0]["state"] == "BUSY" and rogue[0]["job_id"] == "",
            "a session claiming the victim's rank without its credential: counted as claim, tied to no job",
            str(rogue[0] if rogue else answer))
    return victim


def ownership(c, cl, ab, victim, port):
    other = cl.secret_file("other-token", "other-user-token")
    owner = ab.ask(f"job {victim}").split()[2]  # job STATE OWNER ROOT
    c.check(owner == hashlib.sha256(b"user-token").hexdigest(), "the job records the SHA-256 of its submitter's token",
            owner)
    stored = b"".join(open(os.path.join(root, f), "rb").read() for root, _, files in os.walk(cl.state) for f in files)
    c.check(stored and b"user-token" not in stored, "the state directory never holds a token")
    before = refused(port).get("owner", 0)
    rc, _, err = cl.ctl("--token-file", other, "cancel", victim, token=False)
    c.check(rc == 1 and f"job {victim} belongs to another user" in err and len(err.strip().splitlines()) == 1
            and refused(port).get("owner", 0) > before, "another user's token cannot cancel it (counted as owner)",
            err.strip())
    # Reading and resuming are the owner's too: another user sees the job in
    # the queue and nothing of its files.
    as_other = lambda *a: cl.ctl("--token-file", other, *a, token=False)
    for args, verb in ((("status", victim), "read its spec and status"), (("logs", victim), "read its logs"),
                       (("ckpt", "list", victim), "list its checkpoints"), (("shards", victim), "read its shards"),
                       (("resume", victim), "read its spec and status")):
        rc, _, err = as_other(*args)
        c.check(rc == 1 and f"job {victim} belongs to another user: only the token that submitted it may {verb}"
                in err and len(err.strip().splitlines()) == 1, f"another user's token cannot {' '.join(args[:-1])}",
                err.strip())
    rc, out, err = as_other("--json", "jobs")
    c.check(rc == 0 and victim in [j["id"] for j in json.loads(out)["jobs"]], "... but lists it in the queue",
            err.strip())
    vstep = f"{ab.ask(f'job {victim}').split()[3]}/step-00000005"
    rc, out, err = as_other("--json", "submit", job_file(cl.dir, "others", workers=6))  # waits: 2 workers
    mine = json.loads(out)["job_id"] if rc == 0 else None
    link = os.path.join(cl.dir, "link-to-victim")
    os.symlink(vstep, link)
    for path in (vstep, link):
        rc, _, err = as_other("resume", mine, "--from", path)
        c.check(rc == 1 and f"job {victim} belongs to another user: only the token that submitted it may resume "
                "from its checkpoints" in err, f"another user cannot resume from the victim's checkpoint ({path})",
                err.strip())
    as_other("cancel", mine)
    rc, _, err = cl.ctl("--token-file", cl.worker_token_file, "cancel", victim, token=False)
    c.check(rc == 1 and "a worker token may not call CancelJob" in err, "a worker token cannot cancel it", err.strip())
    c.check(cl.job(victim)["state"] == "RUNNING", "the victim still RUNNING")
    rc, _, err = cl.ctl("cancel", victim)
    ok = wait_for(lambda: cl.job(victim)["state"] == "CANCELLED", 10, "the victim's cancel", fail=False)
    c.check(rc == 0 and ok, "its owner cancels it", err.strip())
    # Both real workers idle, so that the planted job runs on them (not on
    # the hostile client's idle session).
    wait_for(lambda: {w["host"] for w in cl.idle_workers()} >= {"host-a", "host-b"}, 20, "the victim's ranks idle")
    planted, before = plant_symlink(c, cl, other, vstep)
    planted_refused(c, cl, other, planted, vstep, before)
    special_files(c, cl, other)
    # A worker's host is listed to every user: one that would act on a
    # terminal, or of 3 MiB (two once broke `workers` for everyone), is
    # refused at registration.
    for kind in ("escape", "huge"):
        code, msg = ab.call(f"register {kind}")
        c.check(code == 3 and msg.startswith("register: host ") and "at most 255 bytes of printable text" in msg,
                f"a worker registering a host name that is {kind}: INVALID_ARGUMENT", f"code {code}: {msg[:120]}")
    rc, out, err = cl.ctl("workers")
    c.check(rc == 0 and "\x1b" not in out and len(out) < 10000, "`shardctl workers` serves every user, no escape in it",
            err.strip())
    # A page token near 2^64 is past the end of the list, not a wrap to its start.
    first = ab.ask("list -").split()
    c.check(first[0] == "list" and int(first[1]) > 0 and first[2] == "-", "ListJobs: one page of every job",
            " ".join(first))
    for token in ("18446744073709551615", "18446744073709550617"):  # 2^64 - 999: + 1000 wrapped to 1
        c.check(ab.ask(f"list {token}") == "list 0 -", f"ListJobs from page_token {token}: an empty last page")
    rc, _, err = cl.ctl("--token-file", other, "delete", victim, token=False)
    c.check(rc == 1 and f"job {victim} belongs to another user" in err, "another user's token cannot delete it",
            err.strip())
    rc, _, err = cl.ctl("delete", victim)
    c.check(rc == 0, "its owner deletes it", err.strip())

    # A token rotated out leaves its jobs to any user (nobody could cancel them otherwise).
    leaving = cl.secret_file("leaving-token", "leaving-token")
    cl.secret_file("token", "user-token\nother-user-token\nleaving-token")
    cl.coordinator.send_signal(signal.SIGHUP)
    wait_for(lambda: cl.ctl("--token-file", leaving, "jobs", token=False)[0] == 0, 10, "the third token")
    rc, out, err = cl.ctl("--json", "--token-file", leaving, "submit", job_file(cl.dir, "big", workers=6), token=False)
    if rc != 0:
        raise RuntimeError(f"submit with the third token: {err.strip()}")
    big = json.loads(out)["job_id"]  # more workers than are registered: it waits
    rc, _, err = cl.ctl("--token-file", other, "cancel", big, token=False)
    c.check(rc == 1 and "belongs to another user" in err, "a queued job is its owner's too", err.strip())
    cl.secret_file("token", "user-token\nother-user-token")
    cl.coordinator.send_signal(signal.SIGHUP)
    wait_for(lambda: "wrong token" in cl.ctl("--token-file", leaving, "jobs", token=False)[2], 10, "the removal")
    rc, _, err = cl.ctl("--token-file", other, "cancel", big, token=False)
    c.check(rc == 0, "once its owner's token is rotated out, any user cancels it", err.strip())

    # Without authentication a job has no owner (read through the hostile
    # client's stub, which holds its rank: the tokens it sends are ignored).
    open_cl = Cluster()
    open_ab = Abuser(open_cl.address, cl.worker_token_file, cl.token_file)
    open_ab.line()  # registered
    wait_for(lambda: open_cl.ctl_json("workers")["workers"], 10, "the abuser in the open registry")
    job = open_cl.ctl_json("submit", job_file(open_cl.dir, "open", workers=1, steps=1000000))["job_id"]
    open_ab.line()  # assigned
    c.check(open_ab.ask(f"job {job}").split()[2] == "-", "a job submitted without authentication has no owner")
    c.check(open_cl.ctl("cancel", job)[0] == 0, "... and anyone cancels it")
    open_ab.quit()

    # Roles by default: one token file for both roles only when asked for.
    state = os.path.join(cl.dir, "state-roles")
    r = subprocess.run([COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", state, "--token-file", cl.token_file],
                       capture_output=True, text=True, timeout=30)
    c.check(r.returncode == 1 and "--token-file needs --worker-token-file" in r.stderr and "--shared-token" in r.stderr,
            "--token-file alone stops the coordinator at start", r.stderr.strip())
    p = subprocess.Popen([COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", state, "--token-file", cl.token_file,
                          "--shared-token"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([p.stdout], [], [], 30)
    line = p.stdout.readline() if ready else ""
    p.terminate()
    p.wait(timeout=10)
    c.check(line.startswith("listening on"), "with --shared-token it starts (one token file, no roles)", line.strip())


def sha256_of(directory):
    return {f: hashlib.sha256(open(os.path.join(directory, f), "rb").read()).hexdigest()
            for f in sorted(os.listdir(directory))}


def plant_symlink(c, cl, other, vstep):
    """The second user submits a job and at once plants its first step
    directory (step 5: well after its rendezvous and first steps), in their
    own checkpoint directory, as a symlink to the victim's committed step.
    (Planted before the submit, the coordinator would not give the job that
    id: it never gives one whose checkpoint directory exists.) Returns the
    job and the victim's step's checksums."""
    before = sha256_of(vstep)
    ckpt = '\n[checkpoint]\ndir = "bckpt"\ninterval = 5\nkeep_latest = 0\n'
    rc, out, err = cl.ctl("--json", "--token-file", other, "submit",
                          job_file(cl.dir, "planted", workers=2, steps=20, extra=ckpt, restarts=0), token=False)
    job = json.loads(out)["job_id"] if rc == 0 else None
    c.check(job is not None, "the second user's job is queued", err.strip())
    os.makedirs(os.path.join(cl.dir, "bckpt", job))
    os.symlink(vstep, os.path.join(cl.dir, "bckpt", job, "step-00000005"))
    return job, before


def planted_refused(c, cl, other, job, vstep, before):
    """Once it runs, its workers refuse to write through the planted link,
    and the victim's files are intact."""
    status = lambda: json.loads(cl.ctl("--json", "--token-file", other, "status", job, token=False)[1])
    ended = wait_for(lambda: status()["state"] in ("FAILED", "SUCCEEDED"), 60, "the planted job's end", fail=False)
    j = status()
    c.check(ended and j["state"] == "FAILED" and "symlink" in j["message"],
            "a step directory planted as a symlink is refused, not written through", f"{j['state']}: {j['message']}")
    c.check(sha256_of(vstep) == before, "the victim's committed step is unchanged")
    wait_for(lambda: {w["host"] for w in cl.idle_workers()} >= {"host-a", "host-b"}, 20, "the planted job's ranks idle")


def special_files(c, cl, other):
    """A second user's config.json that is a FIFO or /dev/zero: each submit
    is refused at once naming the file, and the coordinator keeps serving."""
    for kind in ("fifo", "zero"):
        hf = os.path.join(cl.dir, f"hf-{kind}")
        os.makedirs(hf)
        if kind == "fifo":
            os.mkfifo(os.path.join(hf, "config.json"))
        else:
            os.symlink("/dev/zero", os.path.join(hf, "config.json"))
        spec = job_file(cl.dir, f"special-{kind}", workers=1).replace(".toml", "")
        text = open(spec + ".toml").read().replace("[model]\n", f'[model]\nhf_dir = "{hf}"\n', 1)
        open(spec + ".toml", "w").write(text)
        t0 = time.time()
        for _ in range(4):  # once the coordinator blocked on the 3rd
            rc, _, err = cl.ctl("--token-file", other, "submit", "--skip-local-check", spec + ".toml", token=False,
                                timeout=20)
        c.check(rc == 1 and f"{hf}/config.json" in err and len(err.strip().splitlines()) == 1 and
                time.time() - t0 < 15, f"a config.json that is {kind}: refused at once, naming it", err.strip())
    c.check(cl.ctl("jobs")[0] == 0 and cl.coordinator.poll() is None, "the coordinator still serves every user")


def main():
    c = Checks()
    # The coordinator as shipped: it limits malloc's arenas and trims freed
    # memory itself (coordinator_main.cc), so RSS measures what it holds.
    cl = Cluster(token="user-token", worker_token="worker-token",
                 coordinator_args=["--metrics-listen", "127.0.0.1:0"])
    port = int(cl.coordinator.stdout.readline().split()[-1])  # "metrics on port N"
    cl.secret_file("token", "user-token\nother-user-token")  # two users; shardctl sends the first line
    cl.coordinator.send_signal(signal.SIGHUP)
    other = cl.secret_file("other-token", "other-user-token")
    wait_for(lambda: cl.ctl("--token-file", other, "jobs", token=False)[0] == 0, 10, "the second user's token")

    ab = Abuser(cl.address, cl.worker_token_file, cl.token_file)
    c.check(ab.line() == "registered", "the abuser registers as a worker")
    wait_for(lambda: cl.ctl_json("workers")["workers"], 10, "the abuser in the registry")
    own = cl.ctl_json("submit", job_file(cl.dir, "abusers-own", workers=1, steps=1000000))["job_id"]
    c.check(ab.line() == f"assigned {own} 0", "the abuser holds rank 0 of a job of its own")

    store_pressure(c, cl, ab)
    victim = authority(c, cl, ab, own, port)
    ownership(c, cl, ab, victim, port)
    ab.quit()
    c.check(cl.coordinator.poll() is None and cl.job(own)["id"] == own, "the coordinator still serves")
    c.finish()


if __name__ == "__main__":
    main()
