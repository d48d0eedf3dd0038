"""Writes adamw_bf16.safetensors (tests/unit/optimizer_test.cc): what
torch.optim.AdamW (torch 2.11, CPU, its default single-tensor path) does to
bf16 parameters, whose gradients and moments are bf16 too: no fp32 master,
as training a model loaded in bfloat16 holds it. Two parameters (600
elements with weight decay 0.1, 427 without, one param group each), five
steps; steps 2 and 4 clip the gradients as clip_grad_norm_ does (an in-place
multiply of the bf16 gradient by the fp32 coefficient).

    .venv/bin/python tests/unit/data/make_adamw_bf16.py OUT_FILE

Tensors: p0 (the start), g{s}, clip{s} (a 1-element fp32 coefficient) and
p{s}, m{s}, v{s} (parameters, exp_avg, exp_avg_sq after step s), s = 1..5,
each the two parameters concatenated.
"""
import sys

import torch
from safetensors.torch import save_file

torch.manual_seed(0)
LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1
a = torch.randn(600).to(torch.bfloat16).requires_grad_(True)
b = torch.randn(427).to(torch.bfloat16).requires_grad_(True)
opt = torch.optim.AdamW([{"params": [a], "weight_decay": WD}, {"params": [b], "weight_decay": 0.0}],
                        lr=LR, betas=BETAS, eps=EPS)
out = {"p0": torch.cat([a.detach(), b.detach()])}
for s in range(1, 6):
    g = (torch.randn(1027) * 1e-2).to(torch.bfloat16)
    clip = torch.tensor([0.75 if s in (2, 4) else 1.0], dtype=torch.float32)
    a.grad, b.grad = g[:600].clone(), g[600:].clone()
    if clip.item() != 1.0:
        for t in (a.grad, b.grad):
            t.mul_(clip[0])
    opt.step()
    out[f"g{s}"], out[f"clip{s}"] = g, clip
    out[f"p{s}"] = torch.cat([a.detach(), b.detach()])
    out[f"m{s}"] = torch.cat([opt.state[a]["exp_avg"], opt.state[b]["exp_avg"]])
    out[f"v{s}"] = torch.cat([opt.state[a]["exp_avg_sq"], opt.state[b]["exp_avg_sq"]])
save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1])
