"""A nanoGPT-style GPT-2 (model.py's structure and parameter names), the
reference the engine is checked against. Kept small and literal on purpose."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(C)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab_size, block_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def lr_at(step, total, lr, min_lr, warmup):
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    ratio = (step - warmup) / max(total - warmup, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def fp32_loss(net, x, y):
    """The model's cross-entropy over its logits in fp32, as the engine's head
    computes it whatever the parameters' dtype (train_reference's loss_of)."""
    logits, _ = net(x)
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


def model_from(dump, m):
    """The GPT with the weights of an engine dump (shardline-train --dump-grads)."""
    model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["vocab_size"], m["block_size"])
    state = {k: v for k, v in dump.items() if k.startswith("transformer.")}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    return model


def train_reference(dump, cfg, device="cpu", model=None, loss_of=None, optimizer=None):
    """cfg's steps with torch.optim.AdamW (weight decay on 2-D tensors only),
    clip_grad_norm_ and the warmup+cosine schedule, on the dump's batches,
    from `model` (default: this GPT with the dump's weights) and its
    loss_of(model, inputs, targets) (default: the GPT's own). `optimizer`,
    where given, makes the optimizer instead: optimizer(param_groups, lr,
    betas, eps). Returns (the final parameters by state-dict name, on the
    host; the losses)."""
    m, o = cfg["model"], cfg["optimizer"]
    model = (model if model is not None else model_from(dump, m)).to(device)
    loss_of = loss_of or (lambda net, x, y: net(x, y)[1])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    if optimizer is None:
        opt = torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], foreach=False)
    else:
        opt = optimizer(groups, o["lr"], tuple(o["betas"]), o["eps"])
    steps = cfg["train"]["steps"]
    losses = []
    for s in range(steps):
        key = "batch" if s == 0 else f"batch.{s}"
        for g in opt.param_groups:
            g["lr"] = lr_at(s, steps, o["lr"], o["min_lr"], o["warmup_steps"])
        opt.zero_grad()
        loss = loss_of(model, dump[f"{key}.inputs"].to(device), dump[f"{key}.targets"].to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        losses.append(loss.item())
    params = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return params, losses
