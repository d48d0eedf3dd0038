"""Writes adamw_8bit.safetensors (tests/unit/optimizer_8bit_test.cc): what
bitsandbytes' AdamW8bit (bitsandbytes 0.50.2, its CPU backend, default
arguments but the hyperparameters below) does to fp32 parameters. Three
parameters: a (5000 elements, weight decay 0.1) and c (4300, none) keep their
moments in 8 bits, blocks of 256 (the last of each partial); b (427, none) is
under min_8bit_size (4096) and keeps fp32 moments with bitsandbytes' 32-bit
update. Five steps; steps 2 and 4 clip the gradients as clip_grad_norm_ does
(an in-place multiply of the fp32 gradient by the fp32 coefficient).

    .venv/bin/python tests/unit/data/make_adamw_8bit.py OUT_FILE

Tensors: p0 (the start), g{s}, clip{s} (a 1-element fp32 coefficient) and
p{s}, m{s}, v{s} (parameters, and exp_avg and exp_avg_sq as the values they
hold: the 8-bit ones dequantized) after step s, s = 1..5, each the three
parameters concatenated [a | b | c]; qmap1 and qmap2, the two maps as the
optimizer holds them after its first step (their first entry set to -1 by
the CPU quantizer).
"""
import sys

import torch
import bitsandbytes as bnb
from safetensors.torch import save_file

torch.manual_seed(0)
LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1
SIZES = (5000, 427, 4300)
a, b, c = (torch.randn(n).requires_grad_(True) for n in SIZES)
opt = bnb.optim.AdamW8bit([{"params": [a], "weight_decay": WD}, {"params": [b, c], "weight_decay": 0.0}],
                          lr=LR, betas=BETAS, eps=EPS)


def moment(p, k):
    st = opt.state[p]
    if st[f"state{k}"].dtype == torch.float32:
        return st[f"state{k}"].clone()
    return torch.ops.bitsandbytes.dequantize_blockwise(st[f"state{k}"], st[f"absmax{k}"], st[f"qmap{k}"], 256,
                                                       torch.float32)


out = {"p0": torch.cat([a.detach(), b.detach(), c.detach()]).clone()}
for s in range(1, 6):
    g = torch.randn(sum(SIZES)) * 1e-2
    clip = torch.tensor([0.75 if s in (2, 4) else 1.0], dtype=torch.float32)
    grads = g.split(SIZES)
    for p, gp in zip((a, b, c), grads):
        p.grad = gp.clone()
        if clip.item() != 1.0:
            p.grad.mul_(clip[0])
    opt.step()
    out[f"g{s}"], out[f"clip{s}"] = g, clip
    out[f"p{s}"] = torch.cat([a.detach(), b.detach(), c.detach()]).clone()
    out[f"m{s}"] = torch.cat([moment(p, 1) for p in (a, b, c)])
    out[f"v{s}"] = torch.cat([moment(p, 2) for p in (a, b, c)])
assert opt.state[a]["state1"].dtype == torch.uint8 and opt.state[b]["state1"].dtype == torch.float32
out["qmap1"], out["qmap2"] = opt.state[a]["qmap1"].clone(), opt.state[a]["qmap2"].clone()
save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1])
