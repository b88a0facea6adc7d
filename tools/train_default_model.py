#!/usr/bin/env python3
"""Train qdelta's shipped default model, models/qdelta-tiny (a small Qwen3-Next hybrid: Gated DeltaNet +
gated full attention + MoE with a shared expert), and write its HF-layout files and reference outputs.

Input: data/build/{train.bin,heldout.ids,heldout.txt,stats.json} and models/qdelta-tiny/tokenizer*.json,
made by tools/prepare_training_data.py (run that first, on any CPU machine).

Run on the device machine (one H200, torch 2.11 + transformers 5.17, no flash-linear-attention, so
transformers' torch fallback for the GDN layers is used), from the repo root:

    # device `run`, carry ["data/build"]:
    PYTHONUNBUFFERED=1 python3 tools/train_default_model.py --steps 2200 --out /tmp/qt \
        && tar -C /tmp/qt -cf - . | split -b 15M - $OUT/qdelta-tiny.tar.
    # then here:  cat <files_at>/qdelta-tiny.tar.* | tar -xf - -C models/qdelta-tiny

`--steps` fixes the whole schedule (warmup + cosine), so a run is reproducible for a given
torch/transformers/GPU up to the GPU's own nondeterminism (atomics in backward kernels).
After training, on the CPU in float32 with the BF16-rounded weights, eager attention, it computes
the held-out perplexity and greedy continuations (see --help and the model card for the protocol)
and writes them to <out>/reference/.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK_DIR = os.path.join(ROOT, "models", "qdelta-tiny")

VOCAB = 8192            # embedding rows; tokenizer uses 0..8004 (8000 BPE + 5 specials), rest padding
H = 256
LAYERS = 8
INTERVAL = 4            # layers 3 and 7 are full attention
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
           shared_expert_intermediate_size=128)
ROPE_THETA = 10000.0
PARTIAL_ROTARY = 0.25   # head_dim 64 -> 16 rotary dims
EOT, IM_START, IM_END = 8000, 8001, 8002
WINDOW = 256            # perplexity window
GEN = 32
PROMPTS = [
    "In the beginning",
    "The Python interpreter",
    "A hacker is",
    "dog (noun):",
    "<|im_start|>user\nWhat is Python?<|im_end|>\n<|im_start|>assistant\n",
]


def log(*a):
    print(*a, flush=True)


def config_kwargs():
    kw = dict(
        vocab_size=VOCAB, hidden_size=H, intermediate_size=512, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, hidden_act="silu",
        max_position_embeddings=4096, initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True,
        attention_bias=False, attention_dropout=0.0, linear_conv_kernel_dim=4,
        linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=IM_END, pad_token_id=EOT,
        output_router_logits=True, router_aux_loss_coef=0.001,
    )
    kw.update(MOE)
    return kw


def build_config():
    kw = config_kwargs()
    kw["layer_types"] = ["linear_attention" if (i + 1) % INTERVAL else "full_attention" for i in range(LAYERS)]
    kw["rope_parameters"] = dict(rope_type="default", rope_theta=ROPE_THETA, partial_rotary_factor=PARTIAL_ROTARY)
    return transformers.Qwen3NextConfig(**kw)


def published_config():
    """Flat config.json in the layout of the released Qwen3-Next checkpoints."""
    c = dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next")
    c.update(config_kwargs())
    c["output_router_logits"] = False
    c["full_attention_interval"] = INTERVAL
    c["rope_theta"] = ROPE_THETA
    c["partial_rotary_factor"] = PARTIAL_ROTARY
    c["rope_scaling"] = None
    c["use_sliding_window"] = False
    c["torch_dtype"] = "bfloat16"
    c["transformers_version"] = transformers.__version__
    return dict(sorted(c.items()))


def published_tensors(model):
    """BF16 state dict in the published Qwen3-Next layout (per-expert tensors, no lm_head when tied)."""
    sd = {k: v.detach().float().cpu().clone().contiguous() for k, v in model.state_dict().items()}
    sd.pop("lm_head.weight", None)
    I, E = MOE["moe_intermediate_size"], MOE["num_experts"]
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            assert tuple(v.shape) == (E, 2 * I, H), v.shape
            for e in range(E):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :I].clone()
                out[f"{pre}{e}.up_proj.weight"] = v[e, I:].clone()
            continue
        if k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            assert tuple(v.shape) == (E, H, I), v.shape
            for e in range(E):
                out[f"{pre}{e}.down_proj.weight"] = v[e].clone()
            continue
        out[k] = v
    return {k: out[k].to(torch.bfloat16).contiguous() for k in sorted(out)}


def lr_at(step, steps, peak, warmup, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return floor * peak + (1 - floor) * peak * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


@torch.no_grad()
def window_nll(model, ids, device, batch=16):
    """Sum of NLL and count over non-overlapping WINDOW-token windows (tail dropped); in each window the
    first token is only context, tokens 2..WINDOW are predicted from the window's own prefix."""
    n = len(ids) // WINDOW
    x = torch.tensor(ids[: n * WINDOW], dtype=torch.long).view(n, WINDOW)
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        xb = x[i:i + batch].to(device)
        logits = model(input_ids=xb, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll = -lp.gather(-1, xb[:, 1:, None])[..., 0]
        tot += nll.double().sum().item()
        cnt += nll.numel()
    return tot, cnt, n


def train(args, cfg, device):
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    model = transformers.Qwen3NextForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    model.to(device).train()
    nparam = sum(p.numel() for p in model.parameters())
    log(f"params (unique): {nparam} = {nparam / 1e6:.3f} M")
    data = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16).astype(np.int64))
    data = data.to(device)
    held = [int(t) for t in open(os.path.join(args.data, "heldout.ids")).read().split()]
    log(f"train tokens {len(data)}, held-out tokens {len(held)}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=args.wd), dict(params=no_decay, weight_decay=0.0)],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    L, B = args.seq, args.batch
    curve = []
    t0 = time.time()
    tokens = 0
    ema = None
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup, 0.1)
        for gr in opt.param_groups:
            gr["lr"] = lr
        offs = torch.randint(0, len(data) - L - 1, (B,), generator=g)
        idx = offs[:, None] + torch.arange(L)[None, :]
        x = data[idx.to(device)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(input_ids=x, labels=x, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += B * L
        if step % args.log_every == 0 or step == args.steps - 1:
            lv = loss.item()
            aux = out.aux_loss.item() if getattr(out, "aux_loss", None) is not None else float("nan")
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            rec = dict(step=step, loss=round(lv, 4), aux=round(aux, 4), lr=lr, gnorm=round(gn.item(), 3),
                       tokens=tokens, s=round(time.time() - t0, 1))
            if step % (args.log_every * 10) == 0 or step == args.steps - 1:
                model.eval()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
                    tot, cnt, _ = window_nll(model, held[:64 * WINDOW], device, batch=64)
                model.train()
                rec["heldout_loss_bf16"] = round(tot / cnt, 4)
            curve.append(rec)
            log(json.dumps(rec))
    if device.type == "cuda":
        torch.cuda.synchronize()
    el = time.time() - t0
    log(f"trained {args.steps} steps, {tokens} tokens in {el:.1f}s ({tokens / el:.0f} tok/s), "
        f"peak mem {torch.cuda.max_memory_allocated() / 2**30 if device.type == 'cuda' else 0:.2f} GiB")
    return model, curve, dict(steps=args.steps, tokens=tokens, seconds=round(el, 1), tok_per_s=round(tokens / el),
                              params=nparam, train_tokens_available=len(data),
                              epochs=round(tokens / len(data), 3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "build"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-threads", type=int, default=8)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    log(f"torch {torch.__version__} transformers {transformers.__version__} device {device}")
    try:
        import fla  # noqa: F401
        log("flash-linear-attention present")
    except Exception:
        log("flash-linear-attention absent: transformers' torch GDN fallback")
    cfg = build_config()
    model, curve, tstats = train(args, cfg, device)

    # ---------------------------------------------------------------- save in the published layout
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "reference"))
    tensors = published_tensors(model)
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(published_config(), f, indent=2)
        f.write("\n")
    gen_cfg = dict(bos_token_id=None, eos_token_id=[IM_END, EOT], pad_token_id=EOT, do_sample=True,
                   temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.1,
                   transformers_version=transformers.__version__)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK_DIR, fn), os.path.join(out, fn))

    # ---------------------------------------------------------------- reference outputs (CPU, fp32)
    del model
    torch.set_num_threads(args.eval_threads)
    ref = transformers.Qwen3NextForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr(), "not tied"
    ref_sd = published_tensors(ref)
    assert sorted(ref_sd) == sorted(tensors)
    for k in tensors:
        assert torch.equal(ref_sd[k], tensors[k]), k
    nparam = sum(p.numel() for p in ref.parameters())
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    held_txt = open(os.path.join(args.data, "heldout.txt"), encoding="utf-8").read()
    held = [int(t) for t in open(os.path.join(args.data, "heldout.ids")).read().split()]
    assert tok.encode(held_txt, add_special_tokens=False).ids == held
    t0 = time.time()
    tot, cnt, nwin = window_nll(ref, held, torch.device("cpu"), batch=8)
    ppl = math.exp(tot / cnt)
    log(f"held-out: {len(held)} tokens, {nwin} windows of {WINDOW}, {cnt} predicted, "
        f"mean NLL {tot / cnt:.8f}, ppl {ppl:.8f} ({time.time() - t0:.1f}s)")
    shutil.copy(os.path.join(args.data, "heldout.txt"), os.path.join(out, "reference", "heldout.txt"))
    shutil.copy(os.path.join(args.data, "heldout.ids"), os.path.join(out, "reference", "heldout.ids"))
    cases = []
    for i, p in enumerate(PROMPTS):
        ids = tok.encode(p, add_special_tokens=False).ids
        x = torch.tensor([ids])
        with torch.no_grad():
            o = ref.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=GEN, min_new_tokens=GEN, use_cache=True, pad_token_id=EOT,
                             eos_token_id=None, repetition_penalty=1.0, temperature=None, top_p=None,
                             top_k=None)
            gen = o[0, len(ids):].tolist()
            full = ref(input_ids=torch.tensor([ids + gen]), use_cache=False).logits[0].float()
        gaps, agree = [], True
        for j in range(GEN):
            row = full[len(ids) - 1 + j]
            tv = torch.topk(row, 2)
            gaps.append((tv.values[0] - tv.values[1]).item())
            agree &= tv.indices[0].item() == gen[j]
        text = tok.decode(gen, skip_special_tokens=False)
        with open(os.path.join(out, "reference", f"prompt_{i}.ids"), "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        with open(os.path.join(out, "reference", f"greedy_{i}.ids"), "w") as f:
            f.write(" ".join(map(str, gen)) + "\n")
        cases.append(dict(prompt=p, prompt_ids=f"prompt_{i}.ids", greedy_ids=f"greedy_{i}.ids", ids=ids, gen=gen,
                          text=text, min_top1_top2_gap=min(gaps), full_forward_argmax_agrees=agree))
        log(f"[{i}] {p!r} -> {text!r} (min gap {min(gaps):.4g}, agree {agree})")
    with open(os.path.abspath(__file__), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    ref_json = dict(
        heldout=dict(file="heldout.ids", text="heldout.txt", tokens=len(held), window=WINDOW, windows=nwin,
                     predicted_tokens=cnt, sum_nll=tot, mean_nll=tot / cnt, ppl=ppl,
                     protocol="float32 CPU, eager attention, BF16-rounded weights; ids = tokenizer.encode("
                              "heldout.txt) without special tokens; split into floor(N/256) non-overlapping "
                              "windows of 256 ids starting at 0 (tail dropped); each window is a fresh "
                              "sequence (positions 0..255, empty state); predict ids 1..255 of each window "
                              "from its prefix; ppl = exp(sum NLL / (windows*255)), natural log"),
        greedy=dict(new_tokens=GEN, how="model.generate(do_sample=False, max_new_tokens=32, eos_token_id=None, repetition_penalty=1.0): "
                                        "no stop on EOS, exactly 32 new ids", cases=cases),
        params=nparam, train=tstats, torch=torch.__version__, transformers=transformers.__version__,
        script_sha256=sha, args=vars(args),
    )
    with open(os.path.join(out, "reference", "reference.json"), "w") as f:
        json.dump(ref_json, f, indent=1)
    with open(os.path.join(out, "reference", "heldout_ppl.txt"), "w") as f:
        f.write(f"{ppl:.10g}\n")
    with open(os.path.join(out, "reference", "train_log.json"), "w") as f:
        json.dump(dict(curve=curve, stats=tstats), f, indent=0)
    log("saved", sorted(os.listdir(out)), f"model.safetensors {os.path.getsize(os.path.join(out, 'model.safetensors'))} B")


if __name__ == "__main__":
    main()
