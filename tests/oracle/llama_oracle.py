"""Oracle: the llama family against transformers (the pinned version) on the
same weights and batches, for three tiny models shaped like the families it
covers, each padding at N=3:

  llama3  GQA 4:2, untied head, rope_theta 5e5 with Llama 3's rope scaling
          (head_dim 8: one frequency each below, inside and above the band)
  qwen2   GQA 4:2, q/k/v biases, tied embeddings
  qwen3   GQA 4:1, per-head q/k RMSNorm, tied, head_dim 16 != n_embd / n_head

1. One process, step 0 (2 micro-batches): logits, loss and every gradient of
   the engine match transformers' *ForCausalLM in fp32.
2. Ten steps: torch.optim.AdamW + clip_grad_norm_ + the schedule on the
   transformers model end within 2e-5 of the engine's parameters (N=1, and
   full_shard at N=3).
Equivalence across strategies and world sizes is equivalence.py --family.
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import harness  # noqa: E402
from nanogpt import train_reference  # noqa: E402
from step0 import check_step0  # noqa: E402

torch.set_num_threads(1)


def hf_model(name, m):
    common = dict(vocab_size=m["vocab_size"], hidden_size=m["n_embd"], intermediate_size=m["intermediate_size"],
                  num_hidden_layers=m["n_layer"], num_attention_heads=m["n_head"],
                  num_key_value_heads=m["n_kv_head"], max_position_embeddings=m["block_size"],
                  rms_norm_eps=m["rms_norm_eps"], tie_word_embeddings=m["tie_word_embeddings"],
                  attention_dropout=0.0, torch_dtype=torch.float32)
    rope = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    if m.get("rope_scaling") == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": m["rope_theta"], "factor": m["rope_scaling_factor"],
                "low_freq_factor": m["rope_low_freq_factor"], "high_freq_factor": m["rope_high_freq_factor"],
                "original_max_position_embeddings": m["rope_original_max_position"]}
    if name == "llama3":
        cfg = LlamaConfig(**common, rope_parameters=rope, attention_bias=False, mlp_bias=False)
        model = LlamaForCausalLM(cfg)
    elif name == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_parameters=rope, use_sliding_window=False))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common, rope_parameters=rope, head_dim=m["head_dim"],
                                             attention_bias=False, use_sliding_window=False))
    return model.float().eval()


def llama_config(name, strategy="no_shard", world=1):
    cfg = harness.config(strategy, world, micro_batches=2)
    cfg["model"] = harness.llama_model(name)
    return cfg


def hf_loss(model, x, y):
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))


def main():
    checks = harness.Checks()
    for name in harness.LLAMA_MODELS:
        cfg = llama_config(name)
        m = cfg["model"]
        m.setdefault("head_dim", m["n_embd"] // m["n_head"])
        dump = harness.step0_dump(cfg, "shardline-llama-")
        model = hf_model(name, m)
        state = {k: v for k, v in dump.items() if k.startswith(("model.", "lm_head."))}
        missing, unexpected = model.load_state_dict(state, strict=False)
        expected_missing = ["lm_head.weight"] if m["tie_word_embeddings"] else []
        checks.check(sorted(missing) == expected_missing and not unexpected,
                     f"{name}: every engine tensor is a transformers tensor", f"missing {missing} unexpected {unexpected}")
        logits = model(input_ids=dump["batch.inputs"]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), dump["batch.targets"].reshape(-1))
        check_step0(checks, dump, model, logits, loss, f"{name}: ")

        # The reference starts from the dump's weights, not its own init.
        fresh = hf_model(name, m)
        fresh.load_state_dict(state, strict=False)
        ref, ref_losses = train_reference(dump, cfg, model=fresh, loss_of=hf_loss)
        for strategy, world in (("no_shard", 1), ("full_shard", 3)):
            c = llama_config(name, strategy, world)
            run_out, ranks = harness.run(c, world)
            params = load_file(os.path.join(run_out, "params.safetensors"))
            diff = max(float((params[k] - ref[k]).abs().max()) for k in params)
            losses = [s["loss"] for s in ranks[0]["steps"]]
            lrel = max(abs(a - b) / b for a, b in zip(losses, ref_losses))
            checks.check(diff < 2e-5, f"{name}: 10 steps vs transformers + AdamW, {strategy} N={world}: params",
                         f"max abs diff {diff:.2e}")
            checks.check(lrel < 1e-5, f"{name}: 10 steps vs transformers + AdamW, {strategy} N={world}: losses",
                         f"max rel diff {lrel:.2e}")
    checks.finish()


if __name__ == "__main__":
    main()
