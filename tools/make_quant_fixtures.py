#!/usr/bin/env python3
"""Oracle fixtures for the quantized weight formats (tests/test_quant_*.cpp), computed with PyTorch.

Writes tests/data/quant/*.safetensors:
  codes.safetensors   every E4M3 / E8M0 code point decoded by torch (float8_e4m3fn, float8_e8m0fnu), the
                      E2M1 code points by the OCP formula, and torch's f32 -> float8_e4m3fn cast on a sweep of
                      inputs (every midpoint, range edges, inf/NaN, random bit patterns);
                      the E2M1 encoder's oracle on a sweep (triton_kernels' RTNE bit routine, cross-checked
                      with ModelOpt's searchsorted routine).
  fp8_block.safetensors, mxfp4.safetensors, nvfp4.safetensors
                      a bf16-valued matrix W with awkward shapes and a few all-zero blocks, the published tensors
                      the reference quantizer writes for it, the reference dequantisation, and x, y = x W^T (f64).

References (the formulas are transcribed below; the packages themselves need GPUs or are not installed):
  FP8 block: transformers.integrations.finegrained_fp8.Fp8Quantize (called directly on W zero-padded to whole
             128 blocks and cropped: padding leaves every block amax unchanged); dequantisation by DeepSeek's
             rule W[i, j] = fp8[i, j] * weight_scale_inv[i // 128, j // 128] (inference/kernel.py weight_dequant).
  MXFP4:     triton_kernels numerics_details.mxfp downcast_to_mxfp_torch (ROUND_UP scale, RTNE elements);
             dequantisation E2M1 * float8_e8m0fnu, cross-checked with transformers' gpt-oss
             convert_moe_packed_tensors (ldexp).
  NVFP4:     ModelOpt NVFP4QTensor.get_weights_scaling_factor(_2) / quantize / _cast_fp4 and its dequantize
             E2M1 * (weight_scale.float() * weight_scale_2).
Run: /work/venv/bin/python tools/make_quant_fixtures.py
"""
import os
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "quant")
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def u32_to_f32(bits):
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def e2m1_code_values():
    # OCP MX spec: S.EE.M, bias 1; E = 0 is subnormal (M * 0.5).
    vals = []
    for c in range(16):
        s, e, m = c >> 3, (c >> 1) & 3, c & 1
        mag = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
        vals.append(-mag if s else mag)
    return torch.tensor(vals, dtype=torch.float32)


def rshift(x, n):
    return (x >> n) & ((1 << (32 - n)) - 1) if isinstance(n, int) else (x >> n) & ((1 << (32 - n.clamp(max=31))) - 1)


def e2m1_triton_rtne(v):
    """triton_kernels' f32 -> E2M1 bit routine (round to nearest even, saturating), sign from the sign bit."""
    q = v.contiguous().view(torch.int32)
    signs = q & -0x80000000
    exps = rshift(q, 23) & 0xFF
    mant_orig = q & 0x7FFFFF
    sub = exps < 127
    shift = 127 - exps - 1
    mant_pre = 0x400000 | rshift(mant_orig, 1)
    bit0 = (mant_orig & 1) != 0
    mask = (1 << shift.clamp(min=0, max=31)) - 1
    sticky = sub & (bit0 | ((mant_pre & mask) != 0))
    mant = torch.where(sub, mant_pre >> shift.clamp(min=0, max=31), mant_orig)
    exps = torch.maximum(exps, torch.tensor(126)) - 126
    m2 = rshift(mant, 21) & 3
    lsb = rshift(m2, 1) & 1
    guard = m2 & 1
    sticky = sticky | ((mant & ((1 << 21) - 1)) != 0)
    inc = guard & (sticky.to(torch.int32) | lsb)
    tmp = torch.minimum(rshift(((exps << 2) | m2) + inc, 1), torch.tensor(7))
    return (rshift(signs, 28) | tmp).to(torch.uint8)


def e2m1_modelopt(v):
    """ModelOpt NVFP4QTensor._cast_fp4: searchsorted over the midpoints, ties at the odd ones go up."""
    sign = (v < 0).to(torch.uint8)
    a = v.abs()
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    ordv = torch.searchsorted(bounds, a, out_int32=True).to(torch.uint8)
    odd = torch.any(a.unsqueeze(-1) == bounds[[1, 3, 5]], dim=-1).to(torch.uint8)
    return (sign << 3) + ordv + odd


def pack_nibbles(codes):
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed):
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2, dtype=torch.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def test_matrix(gen, rows, cols, zero_blocks):
    """bf16-valued W with row magnitudes spread over ~2^±6, a few exact zeros and all-zero blocks."""
    w = torch.randn(rows, cols, generator=gen) * torch.exp2(torch.randint(-6, 7, (rows, 1), generator=gen).float())
    w[torch.rand(rows, cols, generator=gen) < 0.02] = 0.0
    for (r0, r1, c0, c1) in zero_blocks:
        w[r0:r1, c0:c1] = 0.0
    return w.to(torch.bfloat16).float()


def linear_case(gen, w_dq, m=5):
    x = torch.randn(m, w_dq.shape[1], generator=gen)
    return x, (x.double() @ w_dq.double().T)


def codes_fixture(gen):
    t = {}
    t["e4m3_values"] = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    t["e8m0_values"] = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e8m0fnu).float()
    t["e2m1_values"] = e2m1_code_values()
    # E4M3 cast sweep: every representable value, every midpoint and its float neighbours, edges, specials.
    vals = t["e4m3_values"][:127]  # non-negative finite codes
    mids = (vals[1:].double() + vals[:-1].double()) / 2
    mids = torch.cat([mids, torch.tensor([464.0, 480.0, 500.0, 1e30])]).float()
    up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    specials = torch.tensor([0.0, float("inf"), float("nan"), 2.0**-10, 2.0**-12, 1e-40, 3e38])
    rnd = u32_to_f32(torch.randint(0, 2**31, (3000,), generator=gen).tolist())
    rnd = rnd[torch.isfinite(rnd)]
    scaled = torch.randn(3000, generator=gen) * torch.exp2(torch.randint(-14, 10, (3000,), generator=gen).float())
    pos = torch.cat([vals, mids, up, down, specials, rnd.abs(), scaled.abs()])
    e4m3_in = torch.cat([pos, -pos])
    t["e4m3_cast_in"] = e4m3_in
    t["e4m3_cast_out"] = e4m3_in.to(torch.float8_e4m3fn).view(torch.uint8)
    # E2M1 encoder sweep (finite inputs; NaN/inf saturate in both references' integer paths).
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    gm = (grid[1:] + grid[:-1]) / 2
    e2_pos = torch.cat([grid, gm, torch.nextafter(gm, torch.full_like(gm, 10.0)), torch.nextafter(gm, torch.zeros_like(gm)),
                        torch.tensor([7.0, 100.0, 1e-30, 1e-45, 0.1, 0.2]), torch.rand(2000, generator=gen) * 8])
    e2_in = torch.cat([e2_pos, -e2_pos[1:]])  # no −0 here: the two references differ only there
    triton_codes, modelopt_codes = e2m1_triton_rtne(e2_in), e2m1_modelopt(e2_in)
    assert torch.equal(triton_codes, modelopt_codes), "triton and ModelOpt E2M1 encoders disagree"
    t["e2m1_cast_in"] = e2_in
    t["e2m1_cast_out"] = triton_codes
    assert e2m1_triton_rtne(torch.tensor([-0.0])).item() == 8 and e2m1_modelopt(torch.tensor([-0.0])).item() == 0
    return t


def fp8_block_fixture(gen):
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    rows, cols = 130, 136  # partial blocks in both dimensions
    w = test_matrix(gen, rows, cols, [(0, 128, 128, 136)])  # the top-right (partial) block all zero
    w[129, 5] = 999424.0  # a block whose scale is large (a bf16 value)
    t = {"w": w.to(torch.bfloat16)}
    pr, pc = -(-rows // 128) * 128, -(-cols // 128) * 128
    padded = torch.zeros(pr, pc)
    padded[:rows, :cols] = w
    for fmt in (None, "ue8m0"):
        cfg = SimpleNamespace(weight_block_size=(128, 128), scale_fmt=fmt)
        out = Fp8Quantize(SimpleNamespace(quantization_config=cfg))._quantize_one("l.weight", padded)
        q = out["l.weight"][:rows, :cols].contiguous()
        s = out["l.weight_scale_inv"].float()  # ue8m0: float8_e8m0fnu, exact powers of two
        dq = q.float() * s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
        suffix = "" if fmt is None else "_ue8m0"
        t["weight" + suffix] = q.view(torch.uint8)
        t["weight_scale_inv" + suffix] = s
        if fmt is None:  # the ue8m0 scales are exact powers of two: the same decode path, one fixture
            t["dequant"] = dq
    x, y = linear_case(gen, t["dequant"])
    t["x"], t["y"] = x, y
    return t


def mxfp4_fixture(gen):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rows, cols = 40, 160
    w = test_matrix(gen, rows, cols, [(3, 4, 32, 64)])
    # downcast_to_mxfp_torch, scale rounding ROUND_UP
    g = w.view(rows, cols // 32, 32)
    ds = g.abs().amax(-1, keepdim=True) / 6.0
    ds_int = ds.view(torch.int32)
    rounded_int = (ds_int + 0x007FFFFF) & 0x7F800000
    rounded = rounded_int.view(torch.float32)
    qscale = torch.where(rounded == 0, torch.tensor(0.0), 1.0 / rounded)
    codes = e2m1_triton_rtne((g * qscale).reshape(rows, cols))
    blocks = pack_nibbles(codes).view(rows, cols // 32, 16)
    scales = (rounded_int.squeeze(-1) >> 23).to(torch.uint8)
    dq = (E2M1[unpack_nibbles(blocks.reshape(rows, cols // 2)).long()].view(rows, cols // 32, 32)
          * scales.view(torch.float8_e8m0fnu).float().unsqueeze(-1)).reshape(rows, cols)
    hf = convert_moe_packed_tensors(blocks.unsqueeze(0), scales.unsqueeze(0), dtype=torch.float32)[0].T
    assert torch.equal(hf, dq), "transformers' gpt-oss MXFP4 dequantisation disagrees"
    t = {"w": w.to(torch.bfloat16), "blocks": blocks, "scales": scales, "dequant": dq}
    t["x"], t["y"] = linear_case(gen, dq)
    return t


def nvfp4_fixture(gen):
    rows, cols = 36, 80  # cols a multiple of 16, not of 32
    w = test_matrix(gen, rows, cols, [(7, 8, 16, 32)])
    ws2 = w.abs().amax().float() / (6.0 * 448.0)
    g = w.view(rows, cols // 16, 16)
    pbs = g.abs().amax(-1).float() / (6.0 * ws2)
    pbs[pbs == 0] = 1.0
    ws = pbs.to(torch.float8_e4m3fn)
    scaled = g / (ws.float() * ws2).unsqueeze(-1)
    codes = e2m1_modelopt(scaled.reshape(rows, cols))
    packed = pack_nibbles(codes)
    dq = (E2M1[unpack_nibbles(packed).long()].view(rows, cols // 16, 16)
          * (ws.float() * ws2).unsqueeze(-1)).reshape(rows, cols)
    t = {"w": w.to(torch.bfloat16), "weight": packed, "weight_scale": ws.view(torch.uint8),
         "weight_scale_2": ws2.reshape([]), "dequant": dq}
    t["x"], t["y"] = linear_case(gen, dq)
    return t


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20261203)
    for name, fn in (("codes", codes_fixture), ("fp8_block", fp8_block_fixture), ("mxfp4", mxfp4_fixture),
                     ("nvfp4", nvfp4_fixture)):
        tensors = {k: v.contiguous() for k, v in fn(gen).items()}
        path = os.path.join(OUT, name + ".safetensors")
        save_file(tensors, path)
        print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
