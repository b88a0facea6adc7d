#!/usr/bin/env python3
"""Quantized golden fixtures: tiny checkpoints in every published quantized layout qdelta loads,
with the Hugging Face transformers fp32 reference run on the *exactly dequantized* weights.

Each fixture starts from one of the BF16 fixtures of tools/make_fixtures.py (tests/fixtures/<base>:
the real transformers classes, odd sizes, both families, the composite Qwen3.5 layout). This script
is its own quantizer: it quantizes the linear layers as each format's producer would publish them,
writes the quantized checkpoint (config.json with quantization_config, hf_quant_config.json for
ModelOpt), dequantizes the stored tensors exactly by the format's published rule (model-spec
section 8) into an fp32 checkpoint of the base layout, and runs transformers on that:

  prompt_<L>.ids / logits_<L>.f32 / greedy_<L>.ids   as in make_fixtures.py (L in 1, 33)
  dequant.f32      rows of the first quantized module of each kind (edges, middle, around row 128), dequantized,
                   fp32, in the order of
                   dequant.json (name, rows, cols, checked_rows): the decoder check of tests/test_quant_load.c
                   (qdelta's dequantization of the stored tensors must give these values); an entry of a
                   fused expert tensor names the tensor and adds experts, expert, parts and part (the
                   gate_up_proj's gate is part 0 of 2)

Formats (fixture name: base, format, what it covers):
  fp8_next_moe      qwen3_next_moe_bf16, fp8 block 128x128, f32 weight_scale_inv: interleaved
                    in_proj_qkvz quantized in stored row order (blocks cross key-head groups),
                    per-expert MoE, modules_to_not_convert
  fp8_35_dense_bf16s qwen3_5_dense_bf16 (composite), fp8 block, bf16 weight_scale_inv
  fp8_35_dense_f32s the same with f32 scales: what qdelta's online --quantization fp8 must give
  fp8_35_moe_f16s   qwen3_5_moe_fused_bf16, fused experts split per expert (as the FP8 releases
                    store them), fp8 block, f16 weight_scale_inv
  ctfp8_35_dense    compressed-tensors float-quantized, channel strategy, ignore with re:
  nvfp4mo_next_moe  ModelOpt NVFP4 (hf_quant_config.json, exclude_modules wildcards: attention and
                    GDN stay BF16), weight_scale_2
  nvfp4ct_35_dense  compressed-tensors nvfp4-pack-quantized, weight_global_scale as a divisor
  nvfp4mo_35_moe_fused  qwen3_5_moe_fused_bf16, ModelOpt NVFP4 of the routed experts only, kept
                    fused as published (model-spec 8.2): experts.gate_up_proj U8 [E, 2I, H/2],
                    _weight_scale e4m3 [E, 2I, H/16], _weight_scale_2 [E, 2] (each expert's gate
                    and up quantized with globals of their own), _input_scale a 0-D scalar;
                    down_proj's globals and input scales [E]; attention, GDN and the shared
                    expert excluded (BF16)
  gptq1_35_dense    GPTQ v1 (zeros stored minus one), sym, group 32, desc_act with g_idx
  gptq2_next_moe    GPTQ v2, asym, group 64
  gptqc_35_moe      GPTQ v1, asym, group -1 (one group per row)
  awq_35_dense      AWQ GEMM packing, asym, group 32
  ctint4_35_dense   compressed-tensors pack-quantized int4 (llm-compressor's W4A16), symmetric, group 32,
                    actorder group (weight_g_idx), bf16 scales, ignore with re:
  ctint4_next_moe   the same format, asymmetric (weight_zero_point packed along the output rows), group 64
  ctint4c_35_moe    the same format, asymmetric, channel strategy (one group per row), per-expert experts
  llmc_next_asym16  the same format as llm-compressor itself writes it (its QuantizationModifier, RTN,
                    asymmetric, group 16; MoE experts linearized per expert by llm-compressor), on
                    qwen3_next_moe_bf16; the reference dequantizes its tensors with compressed-tensors'
                    unpacker and takes its plain tensors as stored (llm-compressor rewrites the offset
                    RMSNorm weights in bf16, which moves some by an ulp)
  llmc_35moe_sym_ch the same on qwen3_5_moe_fused_bf16 (composite), symmetric, channel strategy
  ar_next_gptq      AutoRound's own output (round to nearest, iters 0), auto_round:auto_gptq packing
                    (GPTQ v1 zeros), symmetric, group 32, on qwen3_next_moe_bf16: extra_config leaves the
                    routers, in_proj_ba and the shared experts (48 columns) in 16 bits; the reference
                    dequantizes by GPTQ's rule, checked against AutoRound's own QuantLinear modules
  ar_35moe_awq      the same, auto_round:auto_awq packing, asymmetric, on qwen3_5_moe_fused_bf16 (composite:
                    its extra_config names the layers "model.layers", its tensors "model.language_model")

The compressed-tensors int4 fixtures are also unpacked with compressed-tensors' own unpacker when it is
installed, and must give the values the reference uses (the manifest records whether that ran).

Run (needs torch, transformers >= 5, safetensors, numpy; CPU; compressed-tensors optional; the llmc_*
fixtures need llmcompressor and the ar_* ones auto-round):
    python3 tools/make_quant_fixtures.py --out tests/fixtures/quant
Outputs live under tests/fixtures/quant/<name>/ (a subdirectory, so the BF16 fixture walkers of
other tests -- CUDA, tensor-parallel -- do not pick quantized models up before they support them).
"""
import argparse, copy, glob, json, math, os, re, shutil, sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIX = os.path.join(ROOT, "tests", "fixtures")
GEN = 16
PROMPTS = (1, 33)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

LINEAR = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|in_proj_qkvz|in_proj_qkv|in_proj_z|out_proj|gate_proj|up_proj|"
                    r"down_proj)\.weight$")
KEPT = re.compile(r"(^mtp\.|\.visual\.|^model\.visual\.)")
ROUTERS = re.compile(r"\.(mlp\.gate|shared_expert_gate|in_proj_ba|in_proj_a|in_proj_b)\.weight$|^lm_head\.weight$")


def cdiv(a, b):
    return (a + b - 1) // b


# ------------------------------------------------------------------ quantizers (store, dequant)

def fp8_block(w, br, bc, scale_dtype):
    N, K = w.shape
    s = torch.zeros(cdiv(N, br), cdiv(K, bc))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            a = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].abs().max().item()
            s[i, j] = a / 448.0 if a > 0 else 1.0
    s = s.to(scale_dtype)
    sf = s.float().repeat_interleave(br, 0)[:N].repeat_interleave(bc, 1)[:, :K]
    q = (w / sf).clamp(-448, 448).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": s}, q.float() * sf


def fp8_channel(w):
    s = (w.abs().amax(1, keepdim=True) / 448.0).clamp(min=1e-12)
    q = (w / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": s}, q.float() * s


def e2m1_encode(x):
    mag = x.abs()
    idx = (mag.unsqueeze(-1) - E2M1).abs().argmin(-1)
    return (idx | ((x < 0).to(torch.long) << 3)).to(torch.uint8)


def e2m1_decode(c):
    v = E2M1[(c & 7).long()]
    return torch.where((c & 8) != 0, -v, v)


def nvfp4(w, ct):
    N, K = w.shape
    amax = w.abs().max().item()
    g = amax / (448.0 * 6.0)
    if ct:  # stored as a divisor; the dequant divides by it
        wgs = torch.tensor([1.0 / g], dtype=torch.float32)
        gmul = None
    blocks = w.reshape(N, K // 16, 16)
    bs = (blocks.abs().amax(-1) / 6.0 / g).clamp(min=2.0 ** -9, max=448.0).to(torch.float8_e4m3fn)
    if ct:
        eff = bs.float() / wgs  # e2m1 * weight_scale / weight_global_scale
    else:
        gs2 = torch.tensor(g, dtype=torch.float32)
        eff = bs.float() * gs2
    codes = e2m1_encode(blocks / eff.unsqueeze(-1)).reshape(N, K)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    deq = (e2m1_decode(codes).reshape(N, K // 16, 16) * eff.unsqueeze(-1)).reshape(N, K)
    if ct:
        return {"weight_packed": packed, "weight_scale": bs, "weight_global_scale": wgs,
                "input_global_scale": torch.tensor([1.0], dtype=torch.float32)}, deq
    return {"weight": packed, "weight_scale": bs, "weight_scale_2": gs2,
            "input_scale": torch.tensor(1.0, dtype=torch.float32)}, deq


def int4_groups(w, g, sym, perm, scale_dtype=torch.float16):
    """Per output row and group: scale (fp16 unless asked), zero in [0, 16), codes; g_idx[k] the group of column k."""
    N, K = w.shape
    g = K if g == -1 else g
    G = cdiv(K, g)
    gidx = torch.empty(K, dtype=torch.int32)
    order = perm if perm is not None else torch.arange(K)
    for i, k in enumerate(order.tolist()):
        gidx[k] = i // g
    scales = torch.zeros(G, N, dtype=scale_dtype)
    zeros = torch.zeros(G, N, dtype=torch.int64)
    for gr in range(G):
        cols = (gidx == gr).nonzero().flatten()
        blk = w[:, cols]
        if sym:
            s = (blk.abs().amax(1) / 7.0).clamp(min=1e-6)
            z = torch.full((N,), 8)
        else:
            lo, hi = blk.amin(1).clamp(max=0), blk.amax(1).clamp(min=0)
            s = ((hi - lo) / 15.0).clamp(min=1e-6)
            z = torch.round(-lo / s.to(scale_dtype).float()).clamp(0, 15).long()
        scales[gr] = s.to(scale_dtype)
        zeros[gr] = z
    sf = scales.float()[gidx.long()].T  # [N, K]
    zf = zeros[gidx.long()].T
    q = (torch.round(w / sf) + zf).clamp(0, 15).long()
    deq = (q - zf).float() * sf
    return q, scales, zeros, gidx, deq


def pack_along(vals, axis_len_first):
    """vals int64 [..., 8] nibbles -> int32 words, nibble i at bits 4i."""
    out = torch.zeros(vals.shape[:-1], dtype=torch.int64)
    for i in range(8):
        out |= (vals[..., i] & 15) << (4 * i)
    return (out.to(torch.int64) & 0xFFFFFFFF).numpy().astype(np.uint32).view(np.int32)


def gptq(w, g, sym, version, desc_act, seed):
    N, K = w.shape
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed)) if desc_act else None
    q, scales, zeros, gidx, deq = int4_groups(w, g, sym, perm)
    qweight = pack_along(q.T.reshape(K // 8, 8, N).permute(0, 2, 1), None)          # [K/8, N]
    zst = (zeros - 1) & 15 if version == 1 else zeros
    qzeros = pack_along(zst.reshape(zst.shape[0], N // 8, 8), None)                  # [G, N/8]
    t = {"qweight": torch.from_numpy(qweight), "qzeros": torch.from_numpy(qzeros), "scales": scales}
    if desc_act:
        t["g_idx"] = gidx
    return t, deq


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq(w, g):
    N, K = w.shape
    q, scales, zeros, _, deq = int4_groups(w, g, False, None)
    qt = q.T.reshape(K, N // 8, 8)[..., AWQ_ORDER]                                  # nibble i <- column order[i]
    zt = zeros.reshape(zeros.shape[0], N // 8, 8)[..., AWQ_ORDER]
    return {"qweight": torch.from_numpy(pack_along(qt, None)), "qzeros": torch.from_numpy(pack_along(zt, None)),
            "scales": scales}, deq


def ct_int4(w, g, sym, actorder, seed):
    """compressed-tensors pack-quantized int4: each row's codes (the signed value plus 8) packed along K,
    eight a word, low nibble first; bf16 scales [N, G]; zero points (plus 8) packed along N [N/8, G] when
    asymmetric; weight_g_idx [K] for actorder group; weight_shape [N, K]."""
    N, K = w.shape
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed)) if actorder else None
    q, scales, zeros, gidx, deq = int4_groups(w, g, sym, perm, torch.bfloat16)
    t = {"weight_packed": torch.from_numpy(pack_along(q.reshape(N, K // 8, 8), None)),          # [N, K/8]
         "weight_scale": scales.T.contiguous(),                                                   # [N, G]
         "weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    if not sym:
        G = zeros.shape[0]
        t["weight_zero_point"] = torch.from_numpy(pack_along(zeros.T.reshape(N // 8, 8, G).permute(0, 2, 1), None))
    if actorder:
        t["weight_g_idx"] = gidx
    return t, deq


CT_CHECKED = {"ran": False}


def ct_crosscheck(t, deq, g):
    """The stored tensors through compressed-tensors' own unpacker and the published rule
    w = (q - zero) * scale[g_idx] must give the reference's values exactly."""
    try:
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    except ImportError:
        return
    N, K = (int(x) for x in t["weight_shape"])
    s = t["weight_scale"].float()
    G = s.shape[1]
    q = unpack_from_int32(t["weight_packed"], 4, torch.Size([N, K])).float()
    gi = t["weight_g_idx"].long() if "weight_g_idx" in t else torch.arange(K) // (K if g == -1 else g)
    z = torch.zeros(N, G)
    if "weight_zero_point" in t:
        z = unpack_from_int32(t["weight_zero_point"], 4, torch.Size([N, G]), packed_dim=0).float()
    w = (q - z[:, gi]) * s[:, gi]
    if not torch.equal(w, deq):
        raise RuntimeError("compressed-tensors unpacks the stored int4 tensors to other values")
    CT_CHECKED["ran"] = True


def llmc_quantize(bdir, kw):
    """The base checkpoint through llm-compressor's own W4A16 path (QuantizationModifier, round to
    nearest): its stored tensors and quantization_config, and each quantized module dequantized by
    compressed-tensors' unpacker and the published rule."""
    import tempfile
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    g = kw["g"]
    args = QuantizationArgs(num_bits=4, type="int", symmetric=kw["sym"], strategy="channel" if g == -1 else "group",
                            group_size=None if g == -1 else g)
    ignore = ["lm_head", "re:.*mlp.gate$", "re:.*shared_expert_gate$", "re:.*in_proj_ba$", "re:.*in_proj_a$",
              "re:.*in_proj_b$"]
    model = transformers.AutoModelForCausalLM.from_pretrained(bdir, dtype=torch.bfloat16)
    oneshot(model=model, recipe=QuantizationModifier(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)}, ignore=ignore))
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, save_compressed=True)
        qconf = json.load(open(os.path.join(tmp, "config.json")))["quantization_config"]
        stored = load_file(os.path.join(tmp, "model.safetensors"))
    deq = {}
    for k in stored:
        if not k.endswith(".weight_packed"):
            continue
        mod = k[:-len(".weight_packed")]
        N, K = (int(x) for x in stored[mod + ".weight_shape"])
        sc = stored[mod + ".weight_scale"].float()
        G = sc.shape[1]
        q = unpack_from_int32(stored[k], 4, torch.Size([N, K])).float()
        gi = torch.arange(K) // (K if g == -1 else g)
        z = torch.zeros(N, G)
        if mod + ".weight_zero_point" in stored:
            z = unpack_from_int32(stored[mod + ".weight_zero_point"], 4, torch.Size([N, G]), packed_dim=0).float()
        deq[mod] = (q - z[:, gi]) * sc[:, gi]
    return stored, deq, qconf


def unpack_words(w32, axis):
    """int32 words -> their eight nibbles (low first) spread along `axis` (0: rows, 1: columns)."""
    u = w32.to(torch.int64) & 0xFFFFFFFF
    nib = torch.stack([(u >> (4 * i)) & 15 for i in range(8)], dim=-1)           # [..., words, 8]
    if axis == 0:
        return nib.permute(0, 2, 1).reshape(w32.shape[0] * 8, w32.shape[1])
    return nib.reshape(w32.shape[0], w32.shape[1] * 8)


AUTOROUND_CHILD = r"""
import json, os, sys, glob, torch, transformers
from safetensors.torch import save_file
from auto_round import AutoRound
bdir, root, tmp, g, sym, packing = sys.argv[1:7]
tok = transformers.AutoTokenizer.from_pretrained(os.path.join(root, "models", "qdelta-tiny"))
model = transformers.AutoModelForCausalLM.from_pretrained(bdir, dtype=torch.bfloat16)
AutoRound(model, tokenizer=tok, bits=4, group_size=int(g), sym=sym == "1", iters=0, nsamples=1, seqlen=8,
          disable_opt_rtn=True).quantize_and_save(os.path.join(tmp, "out"), format=packing)
d = os.path.dirname(glob.glob(os.path.join(tmp, "out", "*", "config.json"))[0])
qmodel = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16, device_map="cpu")
theirs = {}
for name, m in qmodel.named_modules():
    if hasattr(m, "qweight"):
        K = m.infeatures if hasattr(m, "infeatures") else m.in_features
        theirs[name] = m(torch.eye(K, dtype=torch.float16)).float().T.contiguous()
save_file(theirs, os.path.join(tmp, "theirs.safetensors"))
print(d)
"""


def autoround_quantize(bdir, kw):
    """The base checkpoint through AutoRound itself (round to nearest, iters 0), in a child process
    (AutoRound replaces transformers' MoE modules in the process that runs it, which would change
    the reference's model): its stored tensors (every file merged), its quantization_config, and each
    quantized module dequantized by the packing's published rule (GPTQ: qweight [K/8, N], zeros stored
    minus one; AWQ: qweight [K, N/8] in the order 0 2 4 6 1 3 5 7, exact zeros), each checked against
    what AutoRound's own QuantLinear module gives (fp16, on the identity)."""
    import subprocess, tempfile
    g, awq = kw["g"], kw["packing"] == "auto_round:auto_awq"
    with tempfile.TemporaryDirectory() as tmp:
        d = subprocess.run([sys.executable, "-c", AUTOROUND_CHILD, bdir, ROOT, tmp, str(g), "1" if kw["sym"] else "0",
                            kw["packing"]], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        qconf = json.load(open(os.path.join(d, "config.json")))["quantization_config"]
        stored = {}
        for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
            stored.update(load_file(f))
        theirs = load_file(os.path.join(tmp, "theirs.safetensors"))
    awq_cols = None
    deq = {}
    for k in stored:
        if not k.endswith(".qweight"):
            continue
        mod = k[:-len(".qweight")]
        s = stored[mod + ".scales"].float()                                          # [G, N]
        G, N = s.shape
        if awq:
            awq_cols = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7]).repeat(N // 8) + torch.arange(N) // 8 * 8
            q = unpack_words(stored[k], 1)[:, awq_cols]                                # [K, N]
            z = unpack_words(stored[mod + ".qzeros"], 1)[:, awq_cols]                 # [G, N]
        else:
            q = unpack_words(stored[k], 0)                                           # [K, N]
            z = (unpack_words(stored[mod + ".qzeros"], 1) + 1) & 15                  # [G, N]
        K = q.shape[0]
        gi = torch.arange(K) // (K if g == -1 else g)
        w = ((q - z[gi]).float() * s[gi]).T.contiguous()                              # [N, K]
        t = theirs.get(mod, theirs.get(mod.replace("model.language_model.", "model.", 1)))
        if t is None or (t - w).abs().max() > 2e-3 * w.abs().max():
            raise RuntimeError(f"{mod}: AutoRound's QuantLinear gives other weights than the published rule")
        deq[mod] = w
    if len(theirs) != len(deq):
        raise RuntimeError(f"AutoRound has {len(theirs)} quantized modules, the checkpoint {len(deq)}")
    return stored, deq, qconf


# ------------------------------------------------------------------ fixtures

FORMATS = {
    "fp8_next_moe": ("qwen3_next_moe_bf16", "fp8", dict(scale_dtype=torch.float32)),
    "fp8_35_dense_bf16s": ("qwen3_5_dense_bf16", "fp8", dict(scale_dtype=torch.bfloat16)),
    "fp8_35_dense_f32s": ("qwen3_5_dense_bf16", "fp8", dict(scale_dtype=torch.float32)),
    "fp8_35_moe_f16s": ("qwen3_5_moe_fused_bf16", "fp8", dict(scale_dtype=torch.float16)),
    "ctfp8_35_dense": ("qwen3_5_dense_bf16", "ctfp8", {}),
    "nvfp4mo_next_moe": ("qwen3_next_moe_bf16", "nvfp4mo", {}),
    "nvfp4ct_35_dense": ("qwen3_5_dense_bf16", "nvfp4ct", {}),
    "nvfp4mo_35_moe_fused": ("qwen3_5_moe_fused_bf16", "nvfp4mo_fused", {}),
    "gptq1_35_dense": ("qwen3_5_dense_bf16", "gptq", dict(g=32, sym=True, version=1, desc_act=True)),
    "gptq2_next_moe": ("qwen3_next_moe_bf16", "gptq", dict(g=64, sym=False, version=2, desc_act=False)),
    "gptqc_35_moe": ("qwen3_5_moe_fused_bf16", "gptq", dict(g=-1, sym=False, version=1, desc_act=False)),
    "awq_35_dense": ("qwen3_5_dense_bf16", "awq", dict(g=32)),
    "ctint4_35_dense": ("qwen3_5_dense_bf16", "ctint4", dict(g=32, sym=True, actorder=True)),
    "ctint4_next_moe": ("qwen3_next_moe_bf16", "ctint4", dict(g=64, sym=False, actorder=False)),
    "ctint4c_35_moe": ("qwen3_5_moe_fused_bf16", "ctint4", dict(g=-1, sym=False, actorder=False)),
    "llmc_next_asym16": ("qwen3_next_moe_bf16", "llmc", dict(g=16, sym=False)),
    "llmc_35moe_sym_ch": ("qwen3_5_moe_fused_bf16", "llmc", dict(g=-1, sym=True)),
    "ar_next_gptq": ("qwen3_next_moe_bf16", "autoround", dict(g=32, sym=True, packing="auto_round:auto_gptq")),
    "ar_35moe_awq": ("qwen3_5_moe_fused_bf16", "autoround", dict(g=32, sym=False, packing="auto_round:auto_awq")),
}


def unfuse_experts(t):
    """experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I] -> experts.{e}.{gate,up,down}_proj.weight."""
    out = {}
    for k, v in t.items():
        m = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", k)
        if not m:
            out[k] = v
            continue
        for e in range(v.shape[0]):
            if m.group(2) == "gate_up_proj":
                I = v.shape[1] // 2
                out[f"{m.group(1)}.{e}.gate_proj.weight"] = v[e, :I]
                out[f"{m.group(1)}.{e}.up_proj.weight"] = v[e, I:]
            else:
                out[f"{m.group(1)}.{e}.down_proj.weight"] = v[e]
    return out


def refuse_experts(deq, t_ref):
    """The dequantized per-expert weights back into the base's fused tensors (the reference layout)."""
    for k in list(t_ref):
        m = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", k)
        if not m:
            continue
        E = t_ref[k].shape[0]
        if m.group(2) == "gate_up_proj":
            t_ref[k] = torch.stack([torch.cat([deq[f"{m.group(1)}.{e}.gate_proj"], deq[f"{m.group(1)}.{e}.up_proj"]])
                                    for e in range(E)])
        else:
            t_ref[k] = torch.stack([deq[f"{m.group(1)}.{e}.down_proj"] for e in range(E)])


FUSED = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
FUSED_PARTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def nvfp4_fused(name, v):
    """A fused expert tensor [E, parts * rows, cols] as ModelOpt NVFP4 keeps it fused: every expert's
    every part (gate_up_proj: gate rows, then up rows) quantized on its own, as a per-expert linear
    would be, its global at [e, part]. The dequantized parts are keyed by their per-expert module
    names (refuse_experts puts them back into the reference's fused tensors)."""
    m = FUSED.match(name)
    parts = FUSED_PARTS[m.group(2)]
    E, rows = v.shape[0], v.shape[1] // len(parts)
    codes, blocks, globals_, deq = [], [], torch.zeros(E, len(parts)), {}
    for e in range(E):
        for p, part in enumerate(parts):
            t, d = nvfp4(v[e, p * rows:(p + 1) * rows].float(), False)
            codes.append(t["weight"])
            blocks.append(t["weight_scale"])
            globals_[e, p] = t["weight_scale_2"]
            deq[f"{m.group(1)}.{e}.{part}"] = d
    stack = lambda xs: torch.stack([torch.cat(xs[e * len(parts):(e + 1) * len(parts)]) for e in range(E)])
    stored = {name: stack(codes), name + "_weight_scale": stack(blocks)}
    if len(parts) == 2:  # separate gate / up globals; one activation scale for all experts (SGLang PR 18965)
        stored[name + "_weight_scale_2"] = globals_
        stored[name + "_input_scale"] = torch.tensor(1.0, dtype=torch.float32)
    else:
        stored[name + "_weight_scale_2"] = globals_[:, 0].contiguous()
        stored[name + "_input_scale"] = torch.ones(E, dtype=torch.float32)
    return stored, deq


def quantize_checkpoint(name, base_tensors, fmt, kw, seed):
    if fmt == "nvfp4mo_fused":  # the routed experts only, fused; everything else stays BF16
        stored, deq = {}, {}
        for k, v in base_tensors.items():
            if FUSED.match(k) and not KEPT.search(k):
                t, d = nvfp4_fused(k, v)
                stored.update({n: tv.contiguous() for n, tv in t.items()})
                deq.update(d)
            else:
                stored[k] = v
        return stored, deq
    src = unfuse_experts(base_tensors)
    stored, deq = {}, {}
    for k, v in src.items():
        mod = k[:-len(".weight")] if k.endswith(".weight") else None
        quant = mod and LINEAR.search(k) and not KEPT.search(k) and v.dim() == 2
        if quant and fmt == "nvfp4mo" and (".self_attn." in k or ".linear_attn." in k):
            quant = False  # the typical ModelOpt recipe: attention and GDN stay BF16
        if not quant:
            stored[k] = v
            continue
        w = v.float()
        if fmt == "fp8":
            t, d = fp8_block(w, 128, 128, kw["scale_dtype"])
        elif fmt == "ctfp8":
            t, d = fp8_channel(w)
        elif fmt in ("nvfp4mo", "nvfp4ct"):
            t, d = nvfp4(w, fmt == "nvfp4ct")
        elif fmt == "gptq":
            t, d = gptq(w, kw["g"], kw["sym"], kw["version"], kw["desc_act"], seed + len(deq))
        elif fmt == "ctint4":
            t, d = ct_int4(w, kw["g"], kw["sym"], kw["actorder"], seed + len(deq))
            ct_crosscheck(t, d, kw["g"])
        else:
            t, d = awq(w, kw["g"])
        for s, tv in t.items():
            stored[f"{mod}.{s}"] = tv.contiguous()
        deq[mod] = d
    return stored, deq


def unconverted(stored):
    mods = []
    for k in stored:
        if k.endswith(".weight") and ROUTERS.search(k) and not KEPT.search(k):
            mods.append(k[:-len(".weight")])
    return sorted(mods) + ["lm_head"]


def quant_config(fmt, kw, stored):
    if fmt == "fp8":
        return dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[128, 128],
                    modules_to_not_convert=unconverted(stored))
    if fmt == "ctfp8":
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}},
                "ignore": ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*in_proj_[ab]$",
                           r"re:.*in_proj_ba$"]}
    if fmt == "ctint4":
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 4, "type": "int", "strategy": "channel" if kw["g"] == -1 else "group",
                    "group_size": None if kw["g"] == -1 else kw["g"], "symmetric": kw["sym"], "dynamic": False,
                    "actorder": "group" if kw["actorder"] else None, "observer": "minmax"},
                    "input_activations": None, "output_activations": None}},
                "ignore": ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*in_proj_[ab]$",
                           r"re:.*in_proj_ba$"]}
    if fmt == "nvfp4ct":
        return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}}},
                "ignore": ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*in_proj_[ab]$"]}
    if fmt == "nvfp4mo":
        return dict(quant_method="modelopt", quant_algo="NVFP4", group_size=16, kv_cache_quant_algo=None,
                    exclude_modules=["lm_head", "*self_attn*", "*linear_attn*", "*mlp.gate", "*shared_expert_gate"])
    if fmt == "nvfp4mo_fused":  # a MoE-only recipe: the routed experts are the only FP4 weights
        return dict(quant_method="modelopt", quant_algo="NVFP4", group_size=16, kv_cache_quant_algo=None,
                    exclude_modules=["lm_head", "*self_attn*", "*linear_attn*", "*mlp.gate", "*shared_expert*"])
    if fmt == "gptq":
        return dict(quant_method="gptq", bits=4, group_size=kw["g"], sym=kw["sym"], desc_act=kw["desc_act"],
                    checkpoint_format="gptq" if kw["version"] == 1 else "gptq_v2")
    return dict(quant_method="awq", bits=4, group_size=kw["g"], zero_point=True, version="gemm")


def hf_model(d, cfg):
    T = transformers
    mt = cfg["model_type"]
    cls = {"qwen3_next": T.Qwen3NextForCausalLM, "qwen3_5": T.Qwen3_5ForConditionalGeneration,
           "qwen3_5_moe": T.Qwen3_5MoeForConditionalGeneration}[mt]
    return cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").float().eval()


@torch.no_grad()
def run_reference(model, ids, vocab):
    x = torch.tensor([ids])
    lg = model(input_ids=x, use_cache=False).logits[0].float()
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=GEN,
                         use_cache=True, pad_token_id=0, eos_token_id=None)
    gen = out[0, len(ids):].tolist()
    full = model(input_ids=torch.tensor([ids + gen]), use_cache=False).logits[0].float()
    gap = min((lambda v: (v[0] - v[1]).item())(torch.topk(full[len(ids) - 1 + i], 2).values) for i in range(GEN))
    ok = all(full[len(ids) - 1 + i].argmax().item() == gen[i] for i in range(GEN))
    return lg, gen, gap, ok


def decoder_sample(deq):
    """The decoder check's rows: of the first module of each kind (name with numbers elided), the
    first and last rows, the middle one and those around the 128-row block edge (where Qwen3-Next's
    in_proj_qkvz blocks cross key-head groups), every column. Small, and every layout is in it.
    Of fused experts, the last expert of that layer too (where a wrong expert stride shows)."""
    kinds = {}
    for n in sorted(deq):
        kinds.setdefault(re.sub(r"\d+", "#", n), n)
    names = set(kinds.values())
    for n in list(names):
        m = re.match(r"(.*\.mlp\.experts)\.0\.(\w+)$", n)
        last = m and max((k for k in deq if k.startswith(m.group(1) + ".") and k.endswith("." + m.group(2))),
                         key=lambda k: int(k[len(m.group(1)) + 1:].split(".")[0]))
        if last:
            names.add(last)
    out = []
    for n in sorted(names):
        R = deq[n].shape[0]
        rows = sorted({r for r in (0, 1, R // 2, 127, 128, 129, R - 2, R - 1) if 0 <= r < R})
        out.append((n, rows))
    return out


def decoder_entry(n, w, rows, stored):
    """dequant.json's entry of module n: its per-expert name, or where it is a part of a stored fused
    tensor, that tensor and the part's place in it."""
    entry = dict(name=n, rows=w.shape[0], cols=w.shape[1], checked_rows=rows)
    m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj$", n)
    fused = m and (m.group(1) + (".down_proj" if m.group(3) == "down" else ".gate_up_proj"))
    if fused in stored:
        entry.update(name=fused, experts=stored[fused].shape[0], expert=int(m.group(2)),
                     parts=1 if m.group(3) == "down" else 2, part=1 if m.group(3) == "up" else 0)
    return entry


def make(name, out, manifest):
    base, fmt, kw = FORMATS[name]
    bdir = os.path.join(FIX, base)
    cfg = json.load(open(os.path.join(bdir, "config.json")))
    base_t = load_file(os.path.join(bdir, "model.safetensors"))
    if fmt == "llmc":
        stored, deq, qconf = llmc_quantize(bdir, kw)
    elif fmt == "autoround":
        stored, deq, qconf = autoround_quantize(bdir, kw)
    else:
        stored, deq = quantize_checkpoint(name, base_t, fmt, kw, seed=1234)
        qconf = quant_config(fmt, kw, stored)
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    qcfg = copy.deepcopy(cfg)
    qcfg["quantization_config"] = qconf  # top level (a sibling of text_config)
    json.dump(qcfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    if fmt.startswith("nvfp4mo"):
        q = dict(qcfg["quantization_config"])
        q.pop("quant_method")
        json.dump({"producer": {"name": "modelopt", "version": "tools/make_quant_fixtures.py"}, "quantization": q},
                  open(os.path.join(d, "hf_quant_config.json"), "w"), indent=2)
    shutil.copy(os.path.join(bdir, "generation_config.json"), d)
    save_file(stored, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    # the reference: the base layout, every quantized module replaced by its exact dequantization
    ref_t = {k: v.float() for k, v in base_t.items()}
    if fmt in ("llmc", "autoround"):  # its plain tensors as it stored them
        ref_t.update({k: v.float() for k, v in stored.items() if k in ref_t})
    for mod, w in deq.items():
        if mod + ".weight" in ref_t:
            ref_t[mod + ".weight"] = w
    refuse_experts(deq, ref_t)
    tmp = os.path.join(out, "_ref_" + name)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
    save_file({k: v.contiguous() for k, v in ref_t.items()}, os.path.join(tmp, "model.safetensors"))
    model = hf_model(tmp, cfg)
    shutil.rmtree(tmp)
    vocab = (cfg.get("text_config") or cfg)["vocab_size"]
    cases = []
    for L in PROMPTS:
        for attempt in range(40):
            ids = np.random.default_rng(100 * L + attempt).integers(0, vocab, size=L).tolist()
            lg, gen, gap, ok = run_reference(model, ids, vocab)
            if ok and gap >= 1e-3:
                break
        else:
            raise RuntimeError(f"{name}: no well-conditioned prompt of length {L}")
        open(os.path.join(d, f"prompt_{L}.ids"), "w").write(" ".join(map(str, ids)) + "\n")
        open(os.path.join(d, f"greedy_{L}.ids"), "w").write(" ".join(map(str, gen)) + "\n")
        lg.numpy().astype("<f4").tofile(os.path.join(d, f"logits_{L}.f32"))
        cases.append(dict(L=L, seed=100 * L + attempt, min_gap=gap))
    # the decoder check: what the reference used, module by module
    sample = decoder_sample(deq)
    json.dump([decoder_entry(n, deq[n], r, stored) for n, r in sample], open(os.path.join(d, "dequant.json"), "w"),
              indent=1)
    np.concatenate([deq[n][r].numpy().astype("<f4").ravel() for n, r in sample]).tofile(os.path.join(d, "dequant.f32"))
    if fmt == "ctint4":
        kw = dict(kw, unpacked_by_compressed_tensors=CT_CHECKED["ran"])
    if fmt == "autoround":
        import auto_round
        kw = dict(kw, auto_round=auto_round.__version__)
    if fmt == "llmc":
        import compressed_tensors, llmcompressor
        kw = dict(kw, llmcompressor=llmcompressor.__version__, compressed_tensors=compressed_tensors.__version__)
    manifest[name] = dict(base=base, format=fmt, options={k: str(v) for k, v in kw.items()}, cases=cases,
                          quantized_modules=len(deq), decoder_checked_modules=len(sample),
                          made_with=dict(torch=torch.__version__, transformers=transformers.__version__))
    print(name, "ok", cases, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(FIX, "quant"))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    mpath = os.path.join(a.out, "MANIFEST.json")
    manifest = json.load(open(mpath)) if a.only and os.path.exists(mpath) else dict(fixtures={})
    if not a.only:  # what made every fixture; a fixture made alone records its own (made_with)
        manifest.update(torch=torch.__version__, transformers=transformers.__version__)
    for name in FORMATS:
        if a.only and name not in a.only:
            continue
        make(name, a.out, manifest["fixtures"])
    json.dump(manifest, open(mpath, "w"), indent=1)


if __name__ == "__main__":
    main()
