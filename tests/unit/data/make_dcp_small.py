"""Writes dcp_small.metadata (tests/unit/dcp_metadata_test.cc; also the seed of
tests/fuzz/corpus/dcp_metadata): the .metadata of a DCP checkpoint that torch
2.11 writes for two FSDP2-sharded Linear layers (4->3->2), their AdamW state
after one step, and an int "step", at world size 1 over Gloo.

    .venv/bin/python tests/unit/data/make_dcp_small.py OUT_DIR   (then OUT_DIR/.metadata)
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
for layer in m:
    fully_shard(layer)
fully_shard(m)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
m(torch.randn(2, 4)).sum().backward()
opt.step()
msd, osd = get_state_dict(m, opt)
dcp.save({"model": msd, "optim": osd, "step": 5}, checkpoint_id=sys.argv[1])
dist.destroy_process_group()
