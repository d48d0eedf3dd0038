"""The FSDP2 side of dcp_oracle.py: one rank of PyTorch FSDP2 (Gloo, CPU) on a
transformers Llama, as a user trains it, and the DCP checkpoints it writes.

  train   RANK WORLD PORT JOB.json DUMP OUT STOP SAVE_AT DCP_DIR
      Steps [0, STOP) of the job (JOB.json: the job's tables and
      "oracle_model", a name of harness.LLAMA_MODELS) on the dump's batches
      (each rank its contiguous 1/WORLD of every batch), from the dump's
      weights, with torch.optim.AdamW (decay on tensors of two or more
      dimensions), clip_grad_norm_ and the job's schedule; after SAVE_AT steps
      writes {"model", "optim"} of get_state_dict to DCP_DIR. Rank 0 writes
      OUT/params-SAVE_AT.safetensors and OUT/params.safetensors (full fp32
      weights at the save and at the end) and OUT/losses.json (the global loss
      of each step).
  resume  RANK WORLD PORT JOB.json DUMP OUT START STOP DCP_DIR
      The same model and optimizer, loaded from DCP_DIR as a user does
      (get_state_dict, dcp.load, set_state_dict), then steps [START, STOP);
      rank 0 writes OUT/params.safetensors and OUT/losses.json.
  load1   DCP_DIR JOB.json OUT_FILE
      One process, no process group: the model's state_dict loaded from
      DCP_DIR with dcp.load, written to OUT_FILE.
  titan   DCP_DIR OUT_DIR N_HEAD N_KV_HEAD TRAIN_STEP
      Re-saves a checkpoint train wrote (one process, no_dist) in torchtitan's
      names: model tensors at the top level (tok_embeddings.weight,
      layers.0.attention.wq.weight, ...), AdamW's under optimizer.state.; wq and
      wk (and their moments) permuted back to interleaved RoPE, as torchtitan's
      convert_from_hf does; and its trainer's train_state.step (an int32 tensor),
      set to TRAIN_STEP.
  retype  DCP_DIR OUT_DIR FQN DTYPE
      Re-saves it (no_dist) with tensor FQN cast to DTYPE (int32, bfloat16).
  poison  DCP_DIR OUT_DIR FQN VALUE
      Re-saves it (no_dist) with the first element of tensor FQN set to VALUE (nan, inf, -1).
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, \
    set_state_dict
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from llama_oracle import hf_loss, hf_model  # noqa: E402
from nanogpt import lr_at  # noqa: E402

torch.set_num_threads(1)


def full_params(model):
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.contiguous().clone() for k, v in sd.items()}


def save_dcp(model, opt, path):
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)


def train(rank, world, port, job_path, dump_path, out, start, stop, save_at=None, save_dir=None, load_dir=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with open(job_path) as f:
        cfg = json.load(f)
    m, o, steps = cfg["model"], cfg["optimizer"], cfg["train"]["steps"]
    dump = load_file(dump_path)
    model = hf_model(cfg["oracle_model"], m).train()
    model.load_state_dict({k: v for k, v in dump.items() if k.startswith(("model.", "lm_head."))}, strict=False)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=o["lr"], betas=tuple(o["betas"]),
                            eps=o["eps"], foreach=False)
    if load_dir:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=load_dir)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses = []
    for s in range(start, stop):
        key = "batch" if s == 0 else f"batch.{s}"
        x, y = dump[f"{key}.inputs"], dump[f"{key}.targets"]
        rows = x.shape[0] // world
        x, y = x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
        for g in opt.param_groups:
            g["lr"] = lr_at(s, steps, o["lr"], o["min_lr"], o["warmup_steps"])
        opt.zero_grad()
        loss = hf_loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
        if s + 1 == save_at:
            save_dcp(model, opt, save_dir)
            params = full_params(model)
            if rank == 0:
                save_file(params, os.path.join(out, f"params-{save_at}.safetensors"))
    params = full_params(model)
    if rank == 0:
        save_file(params, os.path.join(out, "params.safetensors"))
        with open(os.path.join(out, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()
    # Everything this rank owes is written; the marker lets the harness
    # forgive an abort in Gloo's teardown ("terminate called without an
    # active exception"), which PyTorch's ranks at times die of.
    open(os.path.join(out, f"rank-{rank}.done"), "w").close()
    dist.destroy_process_group()


def load1(path, job_path, out_file):
    with open(job_path) as f:
        cfg = json.load(f)
    sd = hf_model(cfg["oracle_model"], cfg["model"]).state_dict()
    dcp.load({"model": sd}, checkpoint_id=path, no_dist=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, out_file)


def load_flat(path):
    """Every tensor of a DCP checkpoint by its flattened name, in one process."""
    md = dcp.FileSystemReader(path).read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=path, no_dist=True)
    return sd


TITAN_IN_LAYER = {"self_attn.q_proj.weight": "attention.wq.weight", "self_attn.k_proj.weight": "attention.wk.weight",
                  "self_attn.v_proj.weight": "attention.wv.weight", "self_attn.o_proj.weight": "attention.wo.weight",
                  "mlp.gate_proj.weight": "feed_forward.w1.weight", "mlp.down_proj.weight": "feed_forward.w2.weight",
                  "mlp.up_proj.weight": "feed_forward.w3.weight", "input_layernorm.weight": "attention_norm.weight",
                  "post_attention_layernorm.weight": "ffn_norm.weight"}
TITAN_WHOLE = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
               "lm_head.weight": "output.weight"}


def titan_name(hf):
    if hf in TITAN_WHOLE:
        return TITAN_WHOLE[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"layers.{layer}.{TITAN_IN_LAYER[rest]}"


def to_interleaved(w, heads):
    """transformers' half-split RoPE rows back to Meta's interleaved pairs:
    torchtitan's convert_from_hf reverse permute."""
    out, dim = w.shape
    return w.view(heads, 2, out // heads // 2, dim).transpose(1, 2).reshape(out, dim).contiguous()


def titan(src, dst, n_head, n_kv_head, train_step):
    sd, new = load_flat(src), {"train_state.step": torch.tensor(train_step, dtype=torch.int32)}
    for k, v in sd.items():
        if k.startswith("model."):
            hf, prefix, suffix = k[len("model."):], "", ""
        else:  # optim.state.<fqn>.<exp_avg|exp_avg_sq|step>
            hf, suffix = k[len("optim.state."):].rsplit(".", 1)
            prefix, suffix = "optimizer.state.", "." + suffix
        if hf.endswith(("q_proj.weight", "k_proj.weight")) and v.dim() == 2:
            v = to_interleaved(v, n_head if "q_proj" in hf else n_kv_head)
        new[prefix + titan_name(hf) + suffix] = v
    dcp.save(new, checkpoint_id=dst, no_dist=True)


def retype(src, dst, fqn, dtype):
    sd = load_flat(src)
    sd[fqn] = sd[fqn].to(getattr(torch, dtype))
    dcp.save(sd, checkpoint_id=dst, no_dist=True)


def poison(src, dst, fqn, value):
    sd = load_flat(src)
    sd[fqn].view(-1)[0] = float(value)
    dcp.save(sd, checkpoint_id=dst, no_dist=True)


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "train":
        train(*map(int, args[:3]), *args[3:6], 0, int(args[6]), save_at=int(args[7]), save_dir=args[8])
    elif mode == "resume":
        train(*map(int, args[:3]), *args[3:6], int(args[6]), int(args[7]), load_dir=args[8])
    elif mode == "load1":
        load1(*args)
    elif mode == "titan":
        titan(args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
    elif mode == "retype":
        retype(*args)
    elif mode == "poison":
        poison(*args)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
