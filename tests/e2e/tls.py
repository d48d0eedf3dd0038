"""TLS: a coordinator serving a certificate; shardctl and a worker that trust
its CA run a job; a client that speaks plaintext to it is refused."""
import json
import os
import re
import subprocess

from cluster import COORDINATOR, SHARDCTL, WORKER, Checks, job_file, wait_for
import cluster


def main():
    c = Checks()
    d = cluster.scratch_dir("shardline-tls-")
    key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    coord = subprocess.Popen([COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", os.path.join(d, "state"),
                              "--tls-cert", cert, "--tls-key", key], stdout=subprocess.PIPE,
                             stderr=open(os.path.join(d, "coordinator.log"), "w"), text=True)
    cluster._procs.append(coord)
    addr = re.match(r"listening on (\S+)", coord.stdout.readline()).group(1)
    worker = subprocess.Popen([WORKER, "--coordinator", addr, "--tls-ca", cert, "--host", "tls-host"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster._procs.append(worker)

    def ctl(*args, tls=True):
        cmd = [SHARDCTL, "--coordinator", addr] + (["--tls-ca", cert] if tls else []) + list(args)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    c.check(wait_for(lambda: '"IDLE"' in ctl("--json", "workers").stdout, 20, "the TLS worker", fail=False),
            "a worker registers over TLS")
    r = ctl("submit", job_file(d, "tls", workers=1, steps=3), "--follow")
    c.check(r.returncode == 0, "a job runs over TLS", r.stderr.strip())
    r = ctl("jobs", tls=False)
    c.check(r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, "plaintext client refused",
            r.stderr.strip())
    c.finish()


if __name__ == "__main__":
    main()
