"""Writes nf4.safetensors (tests/unit/nf4_test.cc): what bitsandbytes 0.50.2
(its CPU backend) makes of two tensors with quantize_4bit(quant_type="nf4",
blocksize=64, compress_statistics=True), QLoRA's storage of a frozen base, and
what dequantize_4bit gives back.

    .venv/bin/python tests/unit/data/make_nf4.py OUT_FILE

For x in (f32: 19237 fp32 values, a partial last block and an odd count;
bf16: 8192 bf16 values): {x}.in (the values), {x}.packed (uint8, two codes a
byte, the first in the high nibble), {x}.qabsmax (uint8, the blocks' absmax
less their mean, 8-bit blockwise over the signed dynamic map),
{x}.absmax2 (fp32, that quantization's scale per 256 blocks), {x}.offset (the
mean), {x}.out (dequantize_4bit, in the input's dtype).
"""
import sys

import torch
import bitsandbytes.functional as F
from safetensors.torch import save_file

torch.manual_seed(0)
out = {}
for name, values in (("f32", torch.randn(19237) * 0.02), ("bf16", (torch.randn(8192) * 0.05).to(torch.bfloat16))):
    packed, state = F.quantize_4bit(values, blocksize=64, compress_statistics=True, quant_type="nf4")
    assert state.nested and state.state2.blocksize == 256
    out[f"{name}.in"] = values
    out[f"{name}.packed"] = packed.reshape(-1)
    out[f"{name}.qabsmax"] = state.absmax
    out[f"{name}.absmax2"] = state.state2.absmax
    out[f"{name}.offset"] = state.offset.reshape(1)
    out[f"{name}.out"] = F.dequantize_4bit(packed, state)
save_file({k: v.contiguous() for k, v in out.items()}, sys.argv[1])
