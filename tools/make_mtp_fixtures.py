#!/usr/bin/env python3
"""Golden fixtures of the MTP head (spec 7.2): tiny random checkpoints that carry a complete
mtp.* head, and the head's logits assembled from transformers' own pieces.

transformers ignores mtp.* (`_keys_to_ignore_on_load_unexpected = ["^mtp.*"]`), so the reference
is put together here from the family's own classes: the main model (Qwen3NextForCausalLM,
Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) gives the final-normed hidden states
(`model.model(...).last_hidden_state`); the head is the family's RMSNorm (zero-centred) for
pre_fc_norm_embedding / pre_fc_norm_hidden / norm, an nn.Linear(2H, H) for fc, and the family's
DecoderLayer built as a full-attention layer (config.layer_types = ["full_attention"]; its FFN is
the family's: sparse MoE with shared expert for Qwen3-Next and Qwen3.5-MoE, dense SwiGLU for
Qwen3.5 dense), run with the main model's rotary embedding and an eager causal mask.

For a prompt of n ids, row p of mtp_logits.f32 ((n-1) x vocab, little-endian float32) is
    lm_head(norm(layer(fc([pre_fc_norm_embedding(embed(id[p+1])) | pre_fc_norm_hidden(hidden[p])]))))
with the layer attending causally over rows 0..p at positions 0..p: the draft of id[p+2].

Fixtures (tests/fixtures_mtp/<name>/: config.json, model.safetensors, prompt.ids, mtp_logits.f32),
weights stored in F32, the checkpoints in the published layouts of tools/make_fixtures.py:
  qwen3_next_moe_mtp      flat qwen3_next, per-expert tensors (mtp.layers.0.mlp.experts.N.*),
                          shared expert, untied lm_head
  qwen3_5_dense_mtp       composite qwen3_5 (model.language_model.*), tied embeddings, dense MTP FFN
  qwen3_5_moe_fused_mtp   composite qwen3_5_moe, fused experts (mtp.layers.0.mlp.experts.gate_up_proj)

Regenerate (pip install torch 'transformers>=5' safetensors numpy), from the repo root:
    python3 tools/make_mtp_fixtures.py --out tests/fixtures_mtp
"""
import argparse
import copy
import hashlib
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (the checkpoint layouts and init rules are shared)

PROMPT_LEN = 45  # odd, crosses two KV blocks of 16
NAMES = {"qwen3_next_moe": "qwen3_next_moe_mtp", "qwen3_5_dense": "qwen3_5_dense_mtp",
         "qwen3_5_moe_fused": "qwen3_5_moe_fused_mtp"}


def family_module(family):
    import importlib
    mod = {"qwen3_next": "qwen3_next.modeling_qwen3_next", "qwen3_5": "qwen3_5.modeling_qwen3_5",
           "qwen3_5_moe": "qwen3_5_moe.modeling_qwen3_5_moe"}[family]
    m = importlib.import_module("transformers.models." + mod)
    prefix = {"qwen3_next": "Qwen3Next", "qwen3_5": "Qwen3_5", "qwen3_5_moe": "Qwen3_5Moe"}[family]
    return getattr(m, prefix + "RMSNorm"), getattr(m, prefix + "DecoderLayer")


class MTPHead(torch.nn.Module):
    """The mtp.* tensors under their checkpoint names (fc, pre_fc_norm_*, layers.0.*, norm)."""

    def __init__(self, family, cfg):
        super().__init__()
        Norm, Layer = family_module(family)
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        lcfg = copy.deepcopy(cfg)
        lcfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
        if hasattr(lcfg, "mlp_only_layers"):
            lcfg.mlp_only_layers = []
        lcfg._attn_implementation = "eager"
        self.pre_fc_norm_embedding = Norm(H, eps=eps)
        self.pre_fc_norm_hidden = Norm(H, eps=eps)
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.layers = torch.nn.ModuleList([Layer(lcfg, 0)])
        self.norm = Norm(H, eps=eps)


@torch.no_grad()
def init_head(head, seed):
    """make_fixtures' rules: zero-centred norms N(0, 0.3), a router large enough that top-k varies,
    other matrices N(0, 1/cols)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(head.named_parameters(), key=lambda x: x[0]):
        s = tuple(p.shape)
        if p.dim() == 1:
            v = torch.randn(s, generator=g) * 0.3
        elif name.endswith("mlp.gate.weight"):
            v = torch.randn(s, generator=g) * (2.0 / s[-1] ** 0.5)
        else:
            v = torch.randn(s, generator=g) / s[-1] ** 0.5
        p.copy_(v)


@torch.no_grad()
def mtp_reference(family, model, head, ids):
    x = torch.tensor([ids], dtype=torch.long)
    hidden = model.model(input_ids=x, use_cache=False).last_hidden_state[0]  # [n][H], after model.norm
    n = len(ids)
    e = head.pre_fc_norm_embedding(model.model.embed_tokens(x[:, 1:]))          # [1][n-1][H]
    hh = head.pre_fc_norm_hidden(hidden[None, :-1])                             # [1][n-1][H]
    h = head.fc(torch.cat([e, hh], dim=-1))
    pos = torch.arange(n - 1)[None]
    rope_pos = pos if family == "qwen3_next" else pos[None].expand(3, 1, -1)
    cos_sin = model.model.rotary_emb(h, rope_pos)
    mask = torch.full((n - 1, n - 1), float("-inf")).triu(1)[None, None]
    out = head.layers[0](h, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos)
    if isinstance(out, tuple):
        out = out[0]
    return model.lm_head(head.norm(out))[0].float()  # [n-1][V]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures_mtp")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    with open(os.path.abspath(__file__), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    os.makedirs(args.out, exist_ok=True)
    manifest = dict(generator="tools/make_mtp_fixtures.py", script_sha256=sha,
                    transformers_version=transformers.__version__, torch_version=torch.__version__,
                    prompt_length=PROMPT_LEN, fixtures=[])
    for spec in mf.SPECS:
        if spec["name"] not in NAMES:
            continue
        spec = dict(spec, mtp_stray=False, shards=1)
        name = NAMES[spec["name"]]
        cfg, kw = mf.build_config(spec)
        model = mf.make_model(spec, cfg)
        mf.init_weights(model, spec["seed"] + 50, 0.1 if spec["tie"] else 1.0)
        model.mtp = MTPHead(spec["family"], cfg).float().eval()  # state_dict: mtp.*
        init_head(model.mtp, spec["seed"] + 51)
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        tensors = mf.published_tensors(spec, model, "f32", spec["seed"])
        assert any(k.startswith("mtp.layers.0.") for k in tensors)
        mf.write_checkpoint(spec, tensors, d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(mf.published_config(spec, kw, "f32"), f, indent=2)
        rng = np.random.default_rng(spec["seed"] * 7 + 1)
        ids = rng.integers(0, mf.VOCAB, size=PROMPT_LEN).tolist()
        ref = mtp_reference(spec["family"], model, model.mtp, ids)
        assert ref.shape == (PROMPT_LEN - 1, mf.VOCAB), ref.shape
        with open(os.path.join(d, "prompt.ids"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        ref.numpy().astype("<f4").tofile(os.path.join(d, "mtp_logits.f32"))
        top2 = torch.topk(ref, 2).values
        manifest["fixtures"].append(dict(
            name=name, family=spec["family"], layout=spec["layout"], tie=spec["tie"],
            mtp_tensors=sorted(k for k in tensors if k.startswith("mtp.")),
            logits_absmax=ref.abs().max().item(),
            min_top1_top2_gap=(top2[:, 0] - top2[:, 1]).min().item()))
        print(name, "absmax", ref.abs().max().item(), flush=True)
    with open(os.path.join(args.out, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
