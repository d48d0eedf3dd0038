"""The coordinator's --state-dir (issue 24, defect 5), on the real binary
and shardctl (no workers needed):

1. A second coordinator on the same --state-dir exits non-zero at once, in
   one line naming the lock file and the pid of the first, which keeps
   serving.
2. A row of the state database whose spec is NULL (written with sqlite3, as
   an operator might) no longer stops the coordinator: it starts, names the
   row in its start log, lists that job FAILED naming the problem, and the
   other job is still PENDING; the row is left as it was.
3. A coordinator.db emptied to 0 bytes is refused at start naming it,
   rather than taken for a new state whose job-1 would reuse old ids."""
import os
import re
import signal
import sqlite3
import subprocess
import time

from cluster import COORDINATOR, SHARDCTL, Checks, job_file, scratch_dir, _procs


def start(state):
    """A coordinator on `state`: (process, its address), once it listens."""
    p = subprocess.Popen([COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", state, "--metrics-port", "-1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _procs.append(p)
    line = p.stdout.readline()
    m = re.match(r"listening on (\S+)", line)
    if not m:
        p.wait(timeout=10)
        raise RuntimeError(f"coordinator did not start: {line} {p.stderr.read()}")
    return p, m.group(1)


def stop(p):
    """SIGTERM and its stderr."""
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=15)
    return err


def ctl(address, *args):
    r = subprocess.run([SHARDCTL, "--coordinator", address] + list(args), capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


def main():
    c = Checks()
    d = scratch_dir("shardline-state-dir-")
    state = os.path.join(d, "state")
    db = os.path.join(state, "coordinator.db")

    # 1. One coordinator per state directory.
    first, address = start(state)
    t0 = time.time()
    second = subprocess.run([COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", state, "--metrics-port", "-1"],
                            capture_output=True, text=True, timeout=30)
    lines = second.stderr.strip().splitlines()
    c.check(second.returncode != 0 and time.time() - t0 < 10, "a second coordinator on the state dir exits at once",
            f"rc {second.returncode}")
    c.check(len(lines) == 1 and os.path.join(state, "coordinator.lock") in lines[0] and f"pid {first.pid}" in lines[0],
            "... in one line naming the lock file and the first one's pid", second.stderr.strip())
    spec = job_file(d, "tiny", workers=1)
    jobs = [ctl(address, "submit", spec) for _ in range(2)]
    c.check(all(rc == 0 for rc, _ in jobs), "the first keeps serving", str(jobs))
    stop(first)

    # 2. A NULL spec in a row: named, kept, the rest serve.
    with sqlite3.connect(db) as con:
        before = con.execute("SELECT job FROM jobs WHERE id = 'job-1'").fetchone()[0]
        con.execute("UPDATE jobs SET spec = NULL WHERE id = 'job-1'")
    con.close()
    p, address = start(state)
    rc1, out1 = ctl(address, "status", "job-1")
    rc2, out2 = ctl(address, "status", "job-2")
    log = stop(p)
    c.check(p.returncode == 0, "a row with a NULL spec no longer stops the coordinator", f"rc {p.returncode}")
    # One log line (server/event_log.h): the detail quoted, its quotes escaped.
    c.check(f'state_row_unreadable detail="{db}: the row of \\"job-1\\" (seq 1): its spec is NULL' in log,
            "its start log names the row",
            log.strip())
    c.check(rc1 == 0 and "FAILED" in out1 and "its spec is NULL" in out1, "status shows that job FAILED naming why",
            out1.strip())
    c.check(rc2 == 0 and "PENDING" in out2, "the other job is still PENDING", out2.strip())
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT job, spec FROM jobs WHERE id = 'job-1'").fetchone()
    con.close()
    c.check(row == (before, None), "the row is left as it was")

    # 3. An emptied database is refused, naming it.
    os.truncate(db, 0)
    r = subprocess.run([COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", state, "--metrics-port", "-1"],
                       capture_output=True, text=True, timeout=30)
    c.check(r.returncode != 0 and f"{db}: the state database is empty (0 bytes)" in r.stderr
            and len(r.stderr.strip().splitlines()) == 1,
            "a coordinator.db emptied to 0 bytes is refused at start naming it", r.stderr.strip())
    c.check(os.path.getsize(db) == 0, "... and left as it was")
    c.remove_unless_failed(d)
    c.finish()


if __name__ == "__main__":
    main()
