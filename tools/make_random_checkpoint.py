#!/usr/bin/env python3
"""Random-weight Qwen3.5 dense checkpoint, saved by transformers itself, for benchmarks that
must read real files (qdelta's safetensors loader, a peer engine's converter) rather than
qdelta's `--load-format dummy`.

The model is transformers' own text class (`Qwen3_5ForCausalLM`, model_type `qwen3_5_text`)
built from a config such as bench/configs/qwen3_5_9b_shape/config.json (its `text_config` when
the config is composite), allocated directly in the target dtype on the target device (an
8 B-parameter model is drawn on a GPU in seconds), filled with seeded, non-trivial values, and
written with `save_pretrained` (safetensors shards + index, config.json, generation_config.json)
exactly as a fine-tuning run would write it. A tokenizer directory (tokenizer.json,
tokenizer_config.json) can be copied beside it so converters and `qdelta run` find one.

Values (per tensor kind; the point is realistic magnitudes, not a trained model):
  * linear and embedding weights: normal(0, initializer_range) (0.02 for Qwen3.5);
  * depthwise conv1d weights: normal(0, 0.25) (kernel 4: a unit-gain filter on average);
  * zero-centred RMSNorm weights (layer norms, q/k norms, final norm; the model scales by
    1 + w): normal(0, 0.02), so the gains sit near 1;
  * the GDN output's gated RMSNorm (scales by w): 1 + normal(0, 0.02);
  * GDN A_log = log(uniform(1, 16)), dt_bias = 1 + normal(0, 0.1).

Examples
  # the issue's 9B shape on the device's GPU (about 16 GB on disk):
  python3 tools/make_random_checkpoint.py --config bench/configs/qwen3_5_9b_shape/config.json \\
      --out /tmp/q9b --device cuda --tokenizer DIR_WITH_QWEN3_TOKENIZER
  # a tiny one on the CPU, for checking the pipeline end to end:
  python3 tools/make_random_checkpoint.py --config bench/configs/qwen3_5_9b_shape/config.json \\
      --out /tmp/tiny --set hidden_size=256 num_hidden_layers=4 intermediate_size=512 \\
      linear_num_key_heads=2 linear_num_value_heads=4 num_attention_heads=4 num_key_value_heads=2
"""
import argparse
import json
import os
import shutil
import sys
import time

import torch
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5 as mq


def log(*a):
    print(*a, flush=True)


def text_config_dict(path, overrides):
    with open(path) as f:
        cfg = json.load(f)
    tc = dict(cfg.get("text_config", cfg))
    if "text_config" in cfg and "tie_word_embeddings" in cfg:
        tc.setdefault("tie_word_embeddings", cfg["tie_word_embeddings"])
    for kv in overrides:
        k, _, v = kv.partition("=")
        if not _:
            sys.exit(f"--set expects KEY=VALUE, got {kv!r}")
        try:
            tc[k] = json.loads(v)
        except json.JSONDecodeError:
            tc[k] = v
    if tc.pop("model_type", "qwen3_5_text") != "qwen3_5_text":
        sys.exit("make_random_checkpoint: only dense qwen3_5 (qwen3_5_text) configs are supported")
    # layer_types follow full_attention_interval unless given; a --set of num_hidden_layers
    # must not leave a stale list behind
    if "layer_types" in tc and len(tc["layer_types"]) != tc["num_hidden_layers"]:
        del tc["layer_types"]
    return tc


@torch.no_grad()
def fill(model, seed, device):
    """Draws every parameter; fails if one is of a kind this script does not know."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    std = model.config.initializer_range
    gated = {id(m.weight) for m in model.modules() if isinstance(m, mq.Qwen3_5RMSNormGated)}
    centred = {id(m.weight) for m in model.modules() if isinstance(m, mq.Qwen3_5RMSNorm)}
    for name, p in model.named_parameters():
        if id(p) in gated:
            p.normal_(0.0, 0.02, generator=g).add_(1.0)
        elif id(p) in centred:
            p.normal_(0.0, 0.02, generator=g)
        elif name.endswith("linear_attn.A_log"):
            p.uniform_(1.0, 16.0, generator=g).log_()
        elif name.endswith("linear_attn.dt_bias"):
            p.normal_(0.0, 0.1, generator=g).add_(1.0)
        elif name.endswith("conv1d.weight"):
            p.normal_(0.0, 0.25, generator=g)
        elif p.dim() == 2:  # linear and embedding weights
            p.normal_(0.0, std, generator=g)
        else:
            raise SystemExit(f"make_random_checkpoint: no rule for parameter {name} {tuple(p.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="config.json (composite qwen3_5 or qwen3_5_text)")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override text-config fields (JSON values)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-shard-size", default="4GB")
    ap.add_argument("--tokenizer", default=None, help="directory whose tokenizer.json / tokenizer_config.json are copied")
    args = ap.parse_args()

    t0 = time.time()
    tc = text_config_dict(args.config, args.set)
    dtype = getattr(torch, args.dtype)
    config = transformers.Qwen3_5TextConfig(**tc)
    config.architectures = ["Qwen3_5ForCausalLM"]
    # allocated in place on the device, in the storage dtype: no float32 copy of 8 B weights
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(args.device):
            model = transformers.Qwen3_5ForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    fill(model, args.seed, args.device)
    n = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            raise SystemExit("make_random_checkpoint: non-finite weights")
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t1 = time.time()
    log(f"model: {n / 1e9:.3f} B parameters ({n}), {args.dtype} on {args.device}, "
        f"{sum(1 for t in config.layer_types if t == 'full_attention')} of {config.num_hidden_layers} layers attention; "
        f"built in {t1 - t0:.1f} s (transformers {transformers.__version__}, torch {torch.__version__})")
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, max_shard_size=args.max_shard_size)
    if args.tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(args.tokenizer, f)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(args.out, f))
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    log(f"saved {args.out}: {sorted(os.listdir(args.out))}, {size / 1e9:.2f} GB in {time.time() - t1:.1f} s")


if __name__ == "__main__":
    main()
