#!/usr/bin/env python3
"""Golden fixtures at the released models' head dimensions, for the CUDA backend.

tools/make_fixtures.py makes tiny models (GDN head dims 16/24, attention head dim 32) whose
greedy steps are only required to have a top-1/top-2 gap of 1e-3: right for checking the fp32
CPU backend to 5e-4, but (a) those head dims never reach the GPU's tensor-core GDN prefill
kernel or its head_dim-256 attention kernels, and (b) a gap of 1e-3 is far below what bf16
activations can resolve, so a bf16 engine cannot be expected to reproduce those continuations.

This script builds the same kind of checkpoint with transformers' real classes and the
published on-disk layouts, reusing make_fixtures.py's initialisation and writers, but with:
  * GDN key/value head dim 128 (1 key head, 2 value heads), attention head dim 256 (2 query /
    1 KV heads, partial rotary 0.25 -> 64 rotated dims), hidden 128, two layers (GDN, then
    attention), MoE 4 experts top-2 of width 32 plus a shared expert: the kernels and tiling of
    Qwen3-Next / Qwen3.5 at a size that keeps the repository small (about 1.5 MB a fixture);
  * prompts of 1, 64, 65 and 130 tokens (one chunk, a chunk plus one, two chunks plus two);
  * BF16 storage (the GPU's format), references from the float32 model holding those weights;
  * every greedy step's top-1/top-2 gap >= MIN_GAP (0.05, about 1% of the largest logit), so
    a continuation is a fair test for bf16 arithmetic; prompts that fail are redrawn.

Run on the device machine (torch + transformers, no internet), from the repository root:
    PYTHONUNBUFFERED=1 python3 tools/make_gpu_fixtures.py --out /tmp/gfx --tar $OUT/gfx.tar.gz
then here:  for f in <files_at>/gfx_*.tar.gz; do tar -xzf $f -C tests/fixtures; done
Fixture directories are named gpu_*; their manifest is tests/fixtures/MANIFEST_gpu.json."""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

H = 128
mf.H = H
mf.VOCAB = 320
mf.PROMPT_LENS = [1, 64, 65, 130]
mf.MIN_GAP = 0.05
mf.COMMON = dict(
    vocab_size=mf.VOCAB, hidden_size=H, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=256, hidden_act="silu",
    max_position_embeddings=4096, initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True,
    attention_bias=False, attention_dropout=0.0, linear_conv_kernel_dim=4,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=1,
)
mf.MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
mf.VISION = dict(mf.VISION, out_hidden_size=H)


def rope_params(spec):
    rp = dict(rope_type="default", rope_theta=spec["theta"], partial_rotary_factor=0.25)
    if spec["family"] != "qwen3_next":
        rp.update(mrope_section=[11, 11, 10], mrope_interleaved=True)  # as the released Qwen3.5
    return rp


mf.rope_params = rope_params

SPECS = [
    dict(name="gpu_qwen3_next_moe", family="qwen3_next", layout="flat", seed=505, hv=2, theta=1e7, interval=2,
         tie=False, extra=dict(mf.MOE, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
         config_layer_types=False, mtp_stray=False, shards=1),
    dict(name="gpu_qwen3_5_moe", family="qwen3_5_moe", layout="composite", seed=606, hv=2, theta=1e7,
         interval=2, tie=False, extra=dict(mf.MOE), config_layer_types=True, shards=1),
    # dense FFN: no routing decisions, so only the arithmetic separates it from the reference
    dict(name="gpu_qwen3_5_dense", family="qwen3_5", layout="composite", seed=707, hv=2, theta=1e7,
         interval=2, tie=False, extra={}, config_layer_types=True, shards=1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tar", default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    with open(os.path.abspath(__file__), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    os.makedirs(args.out, exist_ok=True)
    manifest = dict(generator="tools/make_gpu_fixtures.py (reusing tools/make_fixtures.py)", script_sha256=sha,
                    transformers_version=transformers.__version__, torch_version=torch.__version__,
                    prompt_lengths=mf.PROMPT_LENS, greedy_new_tokens=mf.GEN, min_top1_top2_gap=mf.MIN_GAP,
                    logits_format="raw little-endian float32, row-major [L, vocab_size]", fixtures=[])
    for spec in SPECS:
        fname = spec["name"] + "_bf16"
        mf.log(f"== {fname}")
        cfg, kw = mf.build_config(spec)
        model = mf.make_model(spec, cfg)
        mf.init_weights(model, spec["seed"], 1.0)
        mf.round_bf16(model)
        assert model.model.rotary_emb.inv_freq.numel() == 32  # rope_dim 64
        d = os.path.join(args.out, fname)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        files = mf.write_checkpoint(spec, mf.published_tensors(spec, model, "bf16", spec["seed"]), d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(mf.published_config(spec, kw, "bf16"), f, indent=2)
        cases = []
        for L in mf.PROMPT_LENS:
            r = mf.run_case(model, L, spec["seed"] * 1000 + L * 100)
            with open(os.path.join(d, f"prompt_{L}.ids"), "w") as f:
                f.write(" ".join(map(str, r["ids"])) + "\n")
            with open(os.path.join(d, f"greedy_{L}.ids"), "w") as f:
                f.write(" ".join(map(str, r["gen"])) + "\n")
            r["logits"].numpy().astype("<f4").tofile(os.path.join(d, f"logits_{L}.f32"))
            cases.append(dict(length=L, seed=r["seed"], attempts=r["attempts"], greedy_ids=r["gen"],
                              min_gap=r["min_gap"], logits_absmax=r["logits"].abs().max().item()))
            mf.log(f"    L={L} seed={r['seed']} attempts={r['attempts']} gap={r['min_gap']:.3g} "
                   f"absmax={r['logits'].abs().max().item():.3g}")
        ids = [int(t) for t in open(os.path.join(d, "prompt_65.ids")).read().split()]  # reload check
        ref = torch.from_numpy(np.fromfile(os.path.join(d, "logits_65.f32"), dtype="<f4")).view(len(ids), mf.VOCAB)
        rc = mf.reload_checks(spec, "bf16", d, cfg, ids, ref)
        manifest["fixtures"].append(dict(name=fname, family=spec["family"], layout=spec["layout"], storage="bf16",
                                         weight_seed=spec["seed"], layer_types=kw["layer_types"], cases=cases,
                                         reload_checks=rc, files=sorted(files + ["config.json"])))
    with open(os.path.join(args.out, "MANIFEST_gpu.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    if args.tar:  # one archive per fixture (the device returns files of at most 16 MiB)
        for n in sorted(os.listdir(args.out)):
            with tarfile.open(args.tar.replace(".tar.gz", "") + "_" + n.replace(".json", "") + ".tar.gz", "w:gz") as t:
                t.add(os.path.join(args.out, n), arcname=n)
    mf.log("done")


if __name__ == "__main__":
    main()
