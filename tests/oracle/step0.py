"""What every oracle checks of an engine dump (shardline-train --dump-grads)
against a PyTorch model that ran the dump's step-0 batch: logits within 1e-5,
loss within 1e-6 and every gradient within 1e-4 (max relative error,
normwise), all in fp32."""


def rel(a, b):
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def check_step0(checks, dump, model, logits, loss, label):
    """`logits` and the (not yet backpropagated) `loss` are `model`'s on the
    dump's batch; the gradients are taken here."""
    e = rel(dump["logits"], logits.detach())
    checks.check(e < 1e-5, f"{label}logits", f"max rel error {e:.2e}")
    loss.backward()
    e = abs(float(dump["loss"][0]) - loss.item()) / loss.item()
    checks.check(e < 1e-6, f"{label}loss", f"rel error {e:.2e} ({loss.item():.6f})")
    worst, worst_name = 0.0, ""
    for name, p in model.named_parameters():
        e = rel(dump["grad." + name], p.grad)
        if e > worst:
            worst, worst_name = e, name
    checks.check(worst < 1e-4, f"{label}every gradient", f"max rel error {worst:.2e} ({worst_name})")
