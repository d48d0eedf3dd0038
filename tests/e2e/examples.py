"""The files users copy, run as they are: every job file in examples/ is
planned by `shardctl plan` and submitted to a real local cluster to
SUCCEEDED, and examples/resume-and-import.sh runs its commands against the
first one's checkpoint; then the README's "A first job" commands run, one
shell block, in a scratch folder.

What stands in for what a user brings: a tiny Qwen3 and a tiny Llama saved
by transformers (with a word-level tokenizer that has a chat template) at
the examples' models/ paths, chat JSONL and text turned into token files by
client/prepare_data.py at their data/ paths, Debian's GPL-3 text as
corpus.txt. Each example is shrunk only where its size would not run on two
cores in seconds (the keys in SHRUNK: steps, block_size; every other line
as committed), and the test fails if a shrunk key is not in the file, so
that a changed example is noticed here."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

from cluster import BUILD, Checks, Cluster, free_port, scratch_dir

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from prepare import make_tokenizer, prepare  # noqa: E402

# Each job file, the workers it runs on, and what is shrunk.
SHRUNK = {
    "tiny-gpt.toml": (2, {"steps": "6"}),
    "qwen3-lora-sft.toml": (2, {"block_size": "16", "eval_interval": "2"}),
    "llama-full.toml": (4, {"block_size": "16", "steps": "4", "eval_interval": "2", "interval": "2"}),
    "hybrid-hosts.toml": (4, {"steps": "6"}),
}
CORPUS = "/usr/share/common-licenses/GPL-3"  # base-files: on every Debian machine


def shrink(text, keys, name):
    for key, value in keys.items():
        text, n = re.subn(rf"(?m)^{key} = [^#\n]*?(\s*#.*)?$", rf"{key} = {value}\1", text)
        if n == 0:
            raise SystemExit(f"examples.py: {name} has no '{key} = ' line to shrink: update SHRUNK")
    return text


def make_models(d):
    """models/Qwen3-0.6B and models/Llama-3.2-1B as the examples name them, tiny, with a tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    qwen = os.path.join(d, "models", "Qwen3-0.6B")
    Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                                 max_position_embeddings=64)).save_pretrained(qwen)
    llama = os.path.join(d, "models", "Llama-3.2-1B")
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=64)).save_pretrained(llama)
    for m in (qwen, llama):
        make_tokenizer(m)
    return qwen, llama


def make_data(c, d, qwen, llama):
    os.makedirs(os.path.join(d, "data"))
    chat = os.path.join(d, "chat.jsonl")
    turns = ["the cat sat on the mat", "why is it blue", "the dog ran under a log", "what is red", "yes maybe no"]
    with open(chat, "w") as f:
        for i in range(60):
            f.write(json.dumps({"messages": [{"role": "user", "content": turns[i % 5]},
                                             {"role": "assistant", "content": turns[(i + 2) % 5]}]}) + "\n")
    r = prepare("--tokenizer", qwen, "--input", chat, "--format", "chat", "--pack", "--val-fraction", "0.2",
                "--out", os.path.join(d, "data", "chat"))
    c.check(r.returncode == 0, "prepare_data.py: chat, packed, with a validation split", r.stderr.strip()[-200:])
    text = os.path.join(d, "corpus-words.txt")
    with open(text, "w") as f:
        f.write(" ".join(turns * 80))
    r = prepare("--tokenizer", llama, "--input", text, "--val-fraction", "0.1", "--out", os.path.join(d, "data", "text"))
    c.check(r.returncode == 0, "prepare_data.py: text with a validation split", r.stderr.strip()[-200:])
    shutil.copy(CORPUS, os.path.join(d, "corpus.txt"))


def run_examples(c, cl):
    d = cl.dir
    qwen, llama = make_models(d)
    make_data(c, d, qwen, llama)
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(EXAMPLES, "*.toml")))
    c.check(names == sorted(SHRUNK), "every example job file is run here", str(names))
    jobs = {}
    for name in names:
        workers, keys = SHRUNK[name]
        with open(os.path.join(EXAMPLES, name)) as f:
            text = shrink(f.read(), keys, name)
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = cl.ctl("--json", "plan", path, "--workers", str(workers))
        c.check(rc == 0 and json.loads(out).get("strategies"), f"{name}: shardctl plan", err.strip()[-200:])
        rc, out, err = cl.ctl("--json", "submit", path, "--follow", timeout=300)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        job = lines[0]["job_id"] if lines else ""
        state = cl.job(job) if job else {}
        c.check(rc == 0 and state.get("state") == "SUCCEEDED", f"{name}: submitted, SUCCEEDED",
                f"{state.get('state')} {state.get('message', '')} {err.strip()[-200:]}")
        jobs[name] = (job, path)
    return jobs


def run_resume_and_import(c, cl, job, job_file):
    d = cl.dir
    last = cl.ctl_json("ckpt", "list", job)["checkpoints"][-1]["path"]
    dcp = os.path.join(d, "dcp-in")
    rc, _, err = cl.ctl("ckpt", "export", last, "--format", "dcp", "--job", job_file, "--out", dcp)
    c.check(rc == 0, "a DCP checkpoint to import", err.strip())
    env = dict(os.environ, PATH=os.path.join(BUILD, "client") + os.pathsep + os.environ["PATH"],
               SHARDLINE_COORDINATOR=cl.address, JOB=job, JOB_FILE=job_file, STEP_DIR=last, DCP_DIR=dcp)
    r = subprocess.run(["bash", os.path.join(EXAMPLES, "resume-and-import.sh")], cwd=d, env=env,
                       capture_output=True, text=True, timeout=300)
    c.check(r.returncode == 0, "examples/resume-and-import.sh runs every command", r.stderr.strip()[-300:])
    c.check(os.path.exists(os.path.join(d, "dcp-out", ".metadata")) and glob.glob(os.path.join(d, "imported", "step-*")),
            "and leaves the imported checkpoint and the exported DCP", str(os.listdir(d)))


def readme_block():
    """The sh block under the README's '## A first job'."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## A first job", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return blocks[0] if blocks else ""


def run_readme(c):
    block = readme_block()
    c.check("shardctl submit" in block, "the README's first job has its commands", block[:80])
    d = scratch_dir("shardline-readme-")
    os.symlink(os.path.abspath(BUILD), os.path.join(d, "build"))
    shutil.copytree(EXAMPLES, os.path.join(d, "examples"))
    shutil.copy(CORPUS, os.path.join(d, "examples", "corpus.txt"))
    port = free_port()
    script = "set -euo pipefail\n" + block.replace("127.0.0.1:50051", f"127.0.0.1:{port}")
    # Output to a file, not a pipe: the coordinator and workers it starts in
    # the background would hold a pipe open after the script has ended.
    log_path = os.path.join(d, "readme.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen(["bash", "-c", script], cwd=d, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the coordinator and workers it started in the background
            except ProcessLookupError:
                pass
            p.wait()
    with open(log_path) as f:
        out = f.read()
    c.check(p.returncode == 0, "the README's first job: every command succeeds", out.strip()[-300:])
    c.check(os.path.exists(os.path.join(d, "tiny-hf", "config.json")), "and its HF export is there", "")


def main():
    c = Checks()
    cl = Cluster()
    for host in ("host-a", "host-b"):
        for i in range(2):
            cl.add_worker(host, name=f"{host}-{i}")
    cl.wait_workers(4)
    jobs = run_examples(c, cl)
    if "tiny-gpt.toml" in jobs and jobs["tiny-gpt.toml"][0]:
        run_resume_and_import(c, cl, *jobs["tiny-gpt.toml"])
    run_readme(c)
    c.finish()


if __name__ == "__main__":
    main()
