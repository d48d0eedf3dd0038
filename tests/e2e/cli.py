"""The command line itself: `--version` on every program (`<program>
<version> (<revision>)`, exit 0); shardctl's global flags after the
subcommand as well as before it (against a real coordinator); a mistyped
subcommand, also a nested one, named in one line with the nearest real one
and exit 2; a worker or trainer on a device it cannot see refusing to start; `shardctl completion bash`, sourced in bash, completing
subcommands (nested ckpt ones too), flags and flag values; `shardctl
completion zsh` passing `zsh -n` and, with zsh's completion builtins stubbed,
offering the same candidates (zsh missing is a failure: tests/deps.sh installs it)."""
import json
import os
import re
import shutil
import subprocess

import cluster
from cluster import BUILD, SHARDCTL, Checks, Cluster, job_file

PROGRAMS = {"shardline-coordinator": os.path.join(BUILD, "server", "shardline-coordinator"),
            "shardline-worker": os.path.join(BUILD, "worker", "shardline-worker"),
            "shardline-train": os.path.join(BUILD, "worker", "shardline-train"),
            "shardctl": SHARDCTL}


def run(*args, timeout=30):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def bash_complete(script, *words):
    """The candidates bash's completion function offers for `words` (the last
    one being completed)."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    prog = f"""source {script}
COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()
fn=$(complete -p shardctl | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')
"$fn"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    r = subprocess.run(["bash", "--norc", "-c", prog], capture_output=True, text=True, timeout=30)
    return sorted(x for x in r.stdout.split("\n") if x), r.stderr


def zsh_complete(script, *words):
    """The candidates zsh's _shardctl offers, with _describe, compadd and
    _files stubbed to print them (no terminal, no compinit)."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    prog = f"""compdef() {{ : }}
_describe() {{ local -a a; a=("${{(@P)4}}"); local x; for x in $a; do print -r -- "${{x%%:*}}"; done }}
compadd() {{ shift; local x; for x in "$@"; do print -r -- "$x"; done }}
_files() {{ print -r -- "<files>" }}
source {script}
words=({quoted}); CURRENT=$#words
_shardctl
"""
    r = subprocess.run(["zsh", "-f", "-c", prog], capture_output=True, text=True, timeout=30)
    return sorted(x for x in r.stdout.split("\n") if x), r.stderr


def main():
    c = Checks()

    # --version on every program.
    for name, path in PROGRAMS.items():
        rc, out, err = run(path, "--version")
        c.check(rc == 0 and re.fullmatch(re.escape(name) + r" \d+\.\d+\.\d+ \(([0-9a-f]{7,40}|unknown)\)\n", out) is not None,
                f"{name} --version", (out + err).strip())

    # A mistyped subcommand: one line, the nearest real one, exit 2 (as every
    # usage error); a word far from any command lists them.
    for args, want in ((("stauts", "job-1"), "shardctl: no command 'stauts'; did you mean 'status'?"),
                       (("ckpt", "lsit", "job-1"), "shardctl: no command 'ckpt lsit'; did you mean 'ckpt list'?"),
                       (("--coordinator", "127.0.0.1:1", "--json", "sumbit", "x.toml"),
                        "shardctl: no command 'sumbit'; did you mean 'submit'?")):
        rc, out, err = run(SHARDCTL, *args)
        c.check(rc == 2 and err.strip() == want and out == "", f"typo {' '.join(args)}", f"rc={rc} {err.strip()}")
    rc, _, err = run(SHARDCTL, "frobnicate")
    c.check(rc == 2 and err.startswith("shardctl: no command 'frobnicate' (commands: ") and "submit, jobs, status" in err
            and len(err.strip().splitlines()) == 1, "a word far from any command lists them", err.strip())
    rc, _, err = run(SHARDCTL, "jobs", "--page-size", "0")
    c.check(rc == 2 and err.startswith("--page-size:"), "other usage errors exit 2 too", f"rc={rc}")

    # A device the process cannot use: the program refuses to start, in one
    # line naming the device and how many it sees (no coordinator needed: it
    # never gets that far). cuda:999 is absent on every machine.
    for name in ("shardline-worker", "shardline-train"):
        extra = ["--coordinator", "127.0.0.1:1"] if name == "shardline-worker" else ["--config", "/nonexistent.toml"]
        rc, out, err = run(PROGRAMS[name], *extra, "--device", "cuda:999", timeout=60)
        c.check(rc == 2 and re.fullmatch(rf"{name}: --device: device cuda:999: not visible "
                                         r"\(this process sees \d+ CUDA devices?\)\n", err) is not None,
                f"{name} --device cuda:999 refuses to start, naming the device", f"rc={rc} {err.strip()[:300]}")

    # Global flags after the subcommand, against a real coordinator.
    cl = Cluster(token="s3cret-token", worker_token="w0rker-token")
    cl.add_worker("h0")
    cl.wait_workers(1)
    rc, out, err = cl.ctl("submit", job_file(cl.dir, "flags", workers=1, steps=3), "--json", "--follow")
    job = json.loads(out.splitlines()[0])["job_id"] if rc == 0 else None
    c.check(job is not None, "submit JOB.toml --json --follow (--json after the subcommand)", err.strip())
    ctl = [SHARDCTL]
    tok = ["--token-file", cl.token_file]
    addr = ["--coordinator", cl.address]
    forms = {"before": ctl + addr + tok + ["--json", "status", job or "job-1"],
             "after": ctl + ["status", job or "job-1", "--json"] + addr + tok,
             "between": ctl + ["status", "--json"] + tok + [job or "job-1"] + addr,
             "with =": ctl + [f"--coordinator={cl.address}", "status", job or "job-1", f"--token-file={cl.token_file}",
                              "--json"]}
    seen = {}
    for how, cmd in forms.items():
        rc, out, err = run(*cmd)
        try:
            seen[how] = json.loads(out)
        except ValueError:
            seen[how] = None
        c.check(rc == 0 and seen[how] is not None and seen[how].get("state") == "SUCCEEDED",
                f"status with the global flags {how} the subcommand", (err or out).strip()[:200])
    rc, out, err = run(*ctl, "ckpt", "list", job or "job-1", "--json", *addr, *tok)
    c.check(rc == 0 and "checkpoints" in json.loads(out or "{}"), "ckpt list JOB --json --coordinator ... (nested)",
            err.strip())
    rc, out, err = run(*ctl, "workers", *addr)
    c.check(rc == 1 and "missing token" in err, "a flag after the subcommand is the flag (no token: refused)",
            err.strip())
    rc, out, err = run(*ctl, "jobs", "--json", "--coordinator", "127.0.0.1:1")
    c.check(rc == 1 and "coordinator 127.0.0.1:1 unavailable" in err, "--coordinator after the subcommand is used",
            err.strip()[:120])

    # Completion: bash.
    d = cluster.scratch_dir("shardline-cli-")
    scripts = {}
    for shell in ("bash", "zsh"):
        rc, out, err = run(SHARDCTL, "completion", shell)
        scripts[shell] = os.path.join(d, f"shardctl.{shell}")
        with open(scripts[shell], "w") as f:
            f.write(out)
        c.check(rc == 0 and "_shardctl" in out, f"shardctl completion {shell}", err.strip())
    rc, _, err = run("bash", "-n", scripts["bash"])
    c.check(rc == 0, "bash -n of the bash script", err.strip())
    with open(os.path.join(d, "job.toml"), "w") as f:
        f.write("")
    cases = [(("shardctl", "st"), ["status"]),
             (("shardctl", "s"), ["shards", "status", "submit"]),
             (("shardctl", "ckpt", ""), ["export", "import", "list", "save"]),
             (("shardctl", "--json", "ckpt", "l"), ["list"]),
             (("shardctl", "--coordinator", "h:1", "ckpt", "e"), ["export"]),
             (("shardctl", "status", "job-1", "--j"), ["--json"]),
             (("shardctl", "ckpt", "save", "--t"), ["--timeout", "--tls-ca", "--token-file"]),
             (("shardctl", "ckpt", "export", "x", "--format", ""), ["dcp", "hf", "nanogpt", "peft"]),
             (("shardctl", "completion", ""), ["bash", "zsh"]),
             (("shardctl", "--v"), ["--version"]),
             (("shardctl", "submit", os.path.join(d, "job.t")), [os.path.join(d, "job.toml")])]
    for words, want in cases:
        got, err = bash_complete(scripts["bash"], *words)
        c.check(got == want, f"bash: {' '.join(words)}<TAB>", f"{got} {err.strip()}")

    # zsh: the syntax, and the same walk with zsh's completion builtins stubbed.
    if shutil.which("zsh") is None:  # tests/deps.sh installs it: its absence is a broken setup, not a pass
        c.check(False, "zsh is installed (tests/deps.sh installs it) to check the zsh script")
    else:
        rc, _, err = run("zsh", "-n", scripts["zsh"])
        c.check(rc == 0, "zsh -n of the zsh script", err.strip())
        got, err = zsh_complete(scripts["zsh"], "shardctl", "st")  # zsh filters by the prefix itself
        c.check({"submit", "jobs", "status", "ckpt", "plan", "completion"} <= set(got)
                and not any(g.startswith("-") for g in got), "zsh: shardctl st<TAB> offers the commands", f"{got} {err}")
        zcases = [(("shardctl", "ckpt", ""), ["export", "import", "list", "save"]),
                  (("shardctl", "ckpt", "export", "x", "--format", ""), ["dcp", "hf", "nanogpt", "peft"]),
                  (("shardctl", "submit", "j"), ["<files>"])]
        for words, want in zcases:
            got, err = zsh_complete(scripts["zsh"], *words)
            c.check(got == want, f"zsh: {' '.join(words)}<TAB>", f"{got} {err.strip()}")
        got, _ = zsh_complete(scripts["zsh"], "shardctl", "status", "job-1", "--")
        c.check("--json" in got and "--coordinator" in got and "--help" in got, "zsh: status JOB --<TAB> has the global flags",
                str(got))
    c.finish()


if __name__ == "__main__":
    main()
