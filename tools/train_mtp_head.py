#!/usr/bin/env python3
"""Train the MTP head (spec 7.2) of the shipped default model, models/qdelta-tiny, with the main
model frozen, and write it into the checkpoint as the published Qwen3-Next/Qwen3.5 checkpoints
store theirs (mtp.* tensors beside the main ones; config key mtp_num_hidden_layers 1).

What is trained: only the head, under its checkpoint names
    mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden   zero-centred RMSNorm [H]
    mtp.fc                                              [H, 2H]: columns 0..H-1 the normed embedding,
                                                        H..2H-1 the normed hidden state
    mtp.layers.0.*                                      a full-attention decoder layer with the
                                                        family's FFN (Qwen3-Next: MoE, 8 experts top-2,
                                                        shared expert with sigmoid gate), per-expert
                                                        tensors as in the main layers
    mtp.norm                                            zero-centred RMSNorm [H]
The embedding and the (tied) LM head are the main model's, frozen: the head has none of its own
(mtp_use_dedicated_embeddings false).

Objective, for every pair p of a training window (positions 0..n-3 of n ids):
    h' = norm(layer(fc([pre_fc_norm_embedding(embed(id[p+1])) | pre_fc_norm_hidden(hidden[p])])))
    logits = h' @ embed^T                       predicts id[p+2]
where hidden[p] is the frozen main model's final-normed hidden state at p (what qdelta's
`logits --mtp` and the speculative loop feed), and the layer attends causally over the window's
pairs 0..p at positions 0..p (its own KV cache in the engine). The loss is
    (1 - d) * CE(logits, id[p+2]) + d * CE(logits, softmax(main model's logits at p+1))
with d = --distill: the second term is the main model's own distribution over the same token p+2
(its logits at p+1 are hidden[p+1] @ embed^T), which is what a greedy draft must agree with to be
kept. With --unroll2 w > 0 a second pass trains the head on its own output as well, as the
speculative loop uses it from draft 2 on: pair (h'[p], id[p+2]) at position p+1 predicts id[p+3]
(same loss, weight w), so the head learns to read h' in place of the target's hidden state.

Data: data/build/train.bin from tools/prepare_training_data.py (the stream the main model was
trained on), random windows drawn with a fixed-seed generator; held-out: data/build/heldout.ids.
The frozen hidden states are computed once (float32, transformers' Qwen3NextForCausalLM on the
BF16 weights, stored as bfloat16 in memory); training then runs the head alone.

Reproduce (CPU, 2 threads, about 20 minutes; pip install torch transformers safetensors numpy
tokenizers from PyPI), from the repo root:

    python3 tools/prepare_training_data.py           # data/build/, deterministic
    python3 tools/train_mtp_head.py                  # trains, writes models/qdelta-tiny/{model.safetensors,
                                                     # config.json, reference/mtp_train.json}
    cmake --build build --target qdelta && python3 tools/train_mtp_head.py --check-only --qdelta build/qdelta

Every tensor already in model.safetensors is kept bit for bit (the script hashes each one's bytes
before and after and refuses to write otherwise); mtp.* tensors already there are replaced. The
run is deterministic on CPU for a given torch version and thread count (fixed seeds, one thread
pool, deterministic algorithms).

--check-only --qdelta BIN: the tool-side check of the C engine: `BIN logits -m MODEL --ids F --mtp`
on held-out windows against this script's torch head (float32, eager attention, the head's
BF16-rounded weights as stored); prints the max |difference| relative to max |logit| and the
argmax agreement, and fails past 1e-3 relative.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.models.qwen3_next import modeling_qwen3_next as mq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "models", "qdelta-tiny")
DATA_DIR = os.path.join(ROOT, "data", "build")
MAIN_ATTN_LAYER = 3          # a main full-attention layer: the head's layer has its tensor names
N_TOKENIZER = 8005           # ids 0..8004 are real; rows 8005.. of the embedding are padding


def log(*a):
    print(*a, flush=True)


# ------------------------------------------------------------------------------------------ the head
class MTPHead(torch.nn.Module):
    """The mtp.* module under its checkpoint names (state_dict keys without the mtp. prefix)."""

    def __init__(self, cfg, attn_impl):
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        lcfg = copy.deepcopy(cfg)
        lcfg.layer_types = ["full_attention"] * cfg.num_hidden_layers   # layer 0 is full attention
        lcfg.mlp_only_layers = []
        lcfg._attn_implementation = attn_impl
        self.pre_fc_norm_embedding = mq.Qwen3NextRMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = mq.Qwen3NextRMSNorm(H, eps=eps)
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.layers = torch.nn.ModuleList([mq.Qwen3NextDecoderLayer(lcfg, 0)])
        self.norm = mq.Qwen3NextRMSNorm(H, eps=eps)


@torch.no_grad()
def init_head(head, std, gen):
    """transformers' Qwen3-Next init: zero-centred norms 0 (scale 1), matrices N(0, std)."""
    for name, p in sorted(head.named_parameters(), key=lambda x: x[0]):
        if p.dim() == 1:
            p.zero_()
        else:
            p.copy_(torch.randn(tuple(p.shape), generator=gen) * std)


def head_forward(head, rotary, embed, hidden, next_ids, pos0, causal_mask):
    """hidden [B][n][H] (the target's, or h' of a previous pass), next_ids [B][n] (token after each
    hidden row), positions pos0 .. pos0+n-1 -> h' [B][n][H] (after mtp.norm)."""
    B, n, _ = hidden.shape
    e = head.pre_fc_norm_embedding(embed[next_ids])
    hh = head.pre_fc_norm_hidden(hidden)
    x = head.fc(torch.cat([e, hh], dim=-1))
    pos = (torch.arange(n) + pos0)[None].expand(B, -1)
    cos_sin = rotary(x, pos)
    out = head.layers[0](x, position_embeddings=cos_sin, attention_mask=causal_mask, position_ids=pos)
    if isinstance(out, tuple):
        out = out[0]
    return head.norm(out)


def causal(n, impl):
    """None for sdpa (its own is_causal), an explicit additive mask for eager."""
    if impl == "sdpa":
        return None
    return torch.full((n, n), float("-inf")).triu(1)[None, None]


# ------------------------------------------------------------------------------------ checkpoint io
def tensor_digest(t):
    """sha256 over dtype, shape and the raw bytes."""
    raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    h = hashlib.sha256()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(raw)
    return h.hexdigest()


def read_checkpoint(path):
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, meta


def published_head_tensors(head, cfg, dtype):
    """The head's state dict in the main layers' published layout: mtp. prefix, per-expert
    mlp.experts.N.{gate,up,down}_proj.weight split from transformers' fused parameters."""
    I, E = cfg.moe_intermediate_size, cfg.num_experts
    out = {}
    for k, v in head.state_dict().items():
        v = v.detach().float().cpu()
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            for e in range(E):
                out[f"mtp.{pre}{e}.gate_proj.weight"] = v[e, :I].clone()
                out[f"mtp.{pre}{e}.up_proj.weight"] = v[e, I:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(E):
                out[f"mtp.{pre}{e}.down_proj.weight"] = v[e].clone()
        else:
            out["mtp." + k] = v.clone()
    return {k: out[k].to(dtype).contiguous() for k in sorted(out)}


@torch.no_grad()
def load_head_from_checkpoint(head, tensors, cfg):
    """The inverse of published_head_tensors: the stored (rounded) mtp.* into the module, float32."""
    I, E = cfg.moe_intermediate_size, cfg.num_experts
    sd = {}
    for k in head.state_dict():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = "mtp." + k[: -len("gate_up_proj")]
            sd[k] = torch.stack([torch.cat([tensors[f"{pre}{e}.gate_proj.weight"],
                                            tensors[f"{pre}{e}.up_proj.weight"]]) for e in range(E)])
        elif k.endswith("mlp.experts.down_proj"):
            pre = "mtp." + k[: -len("down_proj")]
            sd[k] = torch.stack([tensors[f"{pre}{e}.down_proj.weight"] for e in range(E)])
        else:
            sd[k] = tensors["mtp." + k]
    head.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    assert sd["layers.0.mlp.experts.gate_up_proj"].shape[1] == 2 * I


def write_checkpoint(model_dir, head_tensors, cfg_extra):
    """Adds / replaces mtp.* in model.safetensors keeping every other tensor bit-identical, and
    sets the config keys. Returns the hashes it checked."""
    st_path = os.path.join(model_dir, "model.safetensors")
    old, meta = read_checkpoint(st_path)
    main = {k: v for k, v in old.items() if not k.startswith("mtp.")}
    before = {k: tensor_digest(v) for k, v in sorted(main.items())}
    ref_names = {k[len(f"model.layers.{MAIN_ATTN_LAYER}."):] for k in main
                 if k.startswith(f"model.layers.{MAIN_ATTN_LAYER}.")}
    head_layer = {k[len("mtp.layers.0."):] for k in head_tensors if k.startswith("mtp.layers.0.")}
    if ref_names != head_layer:
        raise SystemExit(f"mtp.layers.0.* names differ from model.layers.{MAIN_ATTN_LAYER}.*: "
                         f"{sorted(ref_names ^ head_layer)}")
    dtype = main["model.embed_tokens.weight"].dtype
    for k, v in head_tensors.items():
        if v.dtype != dtype:
            raise SystemExit(f"{k}: dtype {v.dtype}, the main weights are {dtype}")
    merged = dict(main)
    merged.update(head_tensors)
    tmp = st_path + ".tmp"
    save_file({k: merged[k] for k in sorted(merged)}, tmp, metadata=meta)
    new, _ = read_checkpoint(tmp)
    after = {k: tensor_digest(new[k]) for k in sorted(main)}
    if after != before:
        bad = [k for k in before if after.get(k) != before[k]]
        os.unlink(tmp)
        raise SystemExit(f"main tensors changed on rewrite: {bad[:5]}")
    for k, v in head_tensors.items():
        if not torch.equal(new[k], v):
            os.unlink(tmp)
            raise SystemExit(f"{k}: read back differently")
    os.chmod(tmp, os.stat(st_path).st_mode & 0o777)   # save_file's temporary mode is 0600
    os.replace(tmp, st_path)
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path) as f:
        text = f.read()
    c = json.loads(text)
    c.update(cfg_extra)
    with open(cfg_path, "w") as f:
        json.dump(dict(sorted(c.items())), f, indent=2)
        if text.endswith("\n"):
            f.write("\n")
    main_digest = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in before.items()).encode()).hexdigest()
    return dict(main_tensors=len(before), main_tensors_sha256=main_digest,
                mtp_tensors=len(head_tensors), file_bytes=os.path.getsize(st_path))


# ---------------------------------------------------------------------------------------- the data
def load_main(model_dir, attn_impl):
    model = transformers.Qwen3NextForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation=attn_impl).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "LM head not tied"
    return model


@torch.no_grad()
def main_hidden(model, ids, batch):
    """ids [N][L] -> final-normed hidden states [N][L][H] as bfloat16 (fresh sequences)."""
    out = []
    for i in range(0, ids.shape[0], batch):
        out.append(model.model(input_ids=ids[i:i + batch], use_cache=False).last_hidden_state.to(torch.bfloat16))
    return torch.cat(out)


def draw_windows(data, n, L, seed):
    g = torch.Generator().manual_seed(seed)
    offs = torch.randint(0, len(data) - L - 1, (n,), generator=g)
    return data[offs[:, None] + torch.arange(L)[None, :]]


# ------------------------------------------------------------------------------------------- loss
def pass_loss(logits, target, teacher_logits, d):
    """Mean over rows of (1-d) CE(target) + d CE(softmax(teacher)); logits [..][V] float32."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    ce = -lp.gather(-1, target[..., None])[..., 0].mean()
    if d == 0:
        return ce, ce
    soft = -(torch.softmax(teacher_logits, dim=-1) * lp).sum(-1).mean()
    return (1 - d) * ce + d * soft, ce


def step_losses(head, rotary, embed, ids, hid, args, impl):
    """ids [B][L], hid [B][L][H] float32 -> (loss, dict of parts, agreement counts)."""
    L = ids.shape[1]
    n = L - 2
    mask = causal(n, impl)
    hp = head_forward(head, rotary, embed, hid[:, :n], ids[:, 1:n + 1], 0, mask)   # pairs 0..n-1
    logits = hp @ embed.T                                                            # predicts ids[p+2]
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        teacher = hid[:, 1:n + 1] @ embed.T                                          # main model at p+1
    loss1, ce1 = pass_loss(logits, ids[:, 2:], teacher, args.distill)
    parts = dict(loss1=loss1.item(), ce1=ce1.item())
    agree = [(logits.argmax(-1) == teacher.argmax(-1)).sum().item(), logits.shape[0] * n]
    loss = loss1
    if args.unroll2 > 0:
        # pair (h'[p], ids[p+2]) at position p+1 predicts ids[p+3]; p = 0..n-2
        m = n - 1
        hp2 = head_forward(head, rotary, embed, hp[:, :m], ids[:, 2:m + 2], 1, causal(m, impl))
        logits2 = hp2 @ embed.T
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            teacher2 = hid[:, 2:m + 2] @ embed.T
        loss2, ce2 = pass_loss(logits2, ids[:, 3:], teacher2, args.distill)
        loss = loss + args.unroll2 * loss2
        parts.update(loss2=loss2.item(), ce2=ce2.item())
        agree += [(logits2.argmax(-1) == teacher2.argmax(-1)).sum().item(), logits2.shape[0] * m]
    return loss, parts, agree


@torch.no_grad()
def evaluate(head, rotary, embed, ids, hid, args, impl, batch=16):
    head.eval()
    tot, agree = {}, None
    nb = 0
    for i in range(0, ids.shape[0], batch):
        _, parts, a = step_losses(head, rotary, embed, ids[i:i + batch], hid[i:i + batch].float(), args, impl)
        for k, v in parts.items():
            tot[k] = tot.get(k, 0.0) + v
        agree = a if agree is None else [x + y for x, y in zip(agree, a)]
        nb += 1
    head.train()
    out = {k: round(v / nb, 4) for k, v in tot.items()}
    out["top1_agree_1"] = round(agree[0] / agree[1], 4)
    if len(agree) > 2:
        out["top1_agree_2"] = round(agree[2] / agree[3], 4)
    return out


def lr_at(step, steps, peak, warmup, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return floor * peak + (1 - floor) * peak * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


# ------------------------------------------------------------------------------------- the check
@torch.no_grad()
def torch_mtp_logits(model, head, ids):
    """The reference of `qdelta logits --mtp`: rows p = 0..n-2, float32, eager attention."""
    x = torch.tensor([ids], dtype=torch.long)
    hidden = model.model(input_ids=x, use_cache=False).last_hidden_state        # [1][n][H]
    embed = model.model.embed_tokens.weight
    n = len(ids) - 1
    hp = head_forward(head, model.model.rotary_emb, embed, hidden[:, :n], x[:, 1:], 0, causal(n, "eager"))
    return (hp @ embed.T)[0]


def check_qdelta(args, cfg):
    model = load_main(args.model, "eager")
    tensors, _ = read_checkpoint(os.path.join(args.model, "model.safetensors"))
    head = MTPHead(cfg, "eager")
    load_head_from_checkpoint(head, tensors, cfg)
    head.eval()
    held = [int(t) for t in open(os.path.join(args.model, "reference", "heldout.ids")).read().split()]
    worst, agree, rows = 0.0, 0, 0
    results = []
    with tempfile.TemporaryDirectory() as td:
        for start, n in ((0, 2), (1000, 37), (5000, 130), (12000, 257)):
            ids = held[start:start + n]
            ref = torch_mtp_logits(model, head, ids)
            idf, outf = os.path.join(td, "ids.txt"), os.path.join(td, "out.f32")
            with open(idf, "w") as f:
                f.write(" ".join(map(str, ids)) + "\n")
            subprocess.run([args.qdelta, "logits", "-m", args.model, "--ids", idf, "--mtp", "-o", outf, "-q",
                            "-t", str(args.threads)], check=True)
            got = torch.from_numpy(np.fromfile(outf, dtype="<f4")).view(n - 1, -1)
            if got.shape != ref.shape:
                raise SystemExit(f"qdelta logits --mtp gave {tuple(got.shape)}, expected {tuple(ref.shape)}")
            rel = ((got - ref).abs().max() / ref.abs().max()).item()
            a = (got.argmax(-1) == ref.argmax(-1)).sum().item()
            worst, agree, rows = max(worst, rel), agree + a, rows + n - 1
            results.append(dict(start=start, n_ids=n, max_rel_diff=rel, argmax_agree=a, rows=n - 1))
            log(f"qdelta logits --mtp, held-out ids [{start}, {start + n}): max |diff| / max |logit| = {rel:.3g}, "
                f"argmax agrees on {a} of {n - 1} rows")
    ok = worst <= 1e-3
    log(f"check {'passed' if ok else 'FAILED'}: worst {worst:.3g} (bound 1e-3), argmax {agree}/{rows}")
    if not ok:
        sys.exit(1)
    return results


# -------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=MODEL_DIR)
    ap.add_argument("--data", default=DATA_DIR)
    ap.add_argument("--windows", type=int, default=2048, help="training windows (hidden states precomputed once)")
    ap.add_argument("--seq", type=int, default=256, help="window length in ids")
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--distill", type=float, default=0.5, help="weight of the main model's distribution")
    ap.add_argument("--unroll2", type=float, default=0.5, help="weight of the pass on the head's own h'")
    ap.add_argument("--bf16", type=int, default=1, help="bf16 autocast for the training steps (fp32 weights)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--no-write", action="store_true", help="train and report, leave the model untouched")
    ap.add_argument("--check-only", action="store_true", help="only compare qdelta with the torch head")
    ap.add_argument("--qdelta", default=None, help="qdelta binary for the check (e.g. build/qdelta)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(args.seed)
    cfg = transformers.AutoConfig.from_pretrained(args.model)
    log(f"torch {torch.__version__} transformers {transformers.__version__}, {args.threads} threads")
    if args.check_only:
        if not args.qdelta:
            raise SystemExit("--check-only needs --qdelta BIN")
        check_qdelta(args, cfg)
        return

    t_all = time.time()
    impl = "sdpa"
    model = load_main(args.model, impl)
    embed = model.model.embed_tokens.weight          # [V][H] frozen, also the tied LM head
    rotary = model.model.rotary_emb
    data = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16).astype(np.int64))
    held_all = [int(t) for t in open(os.path.join(args.data, "heldout.ids")).read().split()]
    L = args.seq
    ids = draw_windows(data, args.windows, L, args.seed)
    nh = len(held_all) // L
    held = torch.tensor(held_all[: nh * L]).view(nh, L)
    t0 = time.time()
    hid = main_hidden(model, ids, 16)
    hid_held = main_hidden(model, held, 16)
    t_pre = time.time() - t0
    log(f"hidden states: {args.windows} training windows x {L} + {nh} held-out windows in {t_pre:.0f}s "
        f"({(args.windows + nh) * L / t_pre:.0f} tok/s)")

    head = MTPHead(cfg, impl).float()
    init_head(head, cfg.initializer_range, torch.Generator().manual_seed(args.seed + 1))
    head.train()
    nparam = sum(p.numel() for p in head.parameters())
    decay = [p for p in head.parameters() if p.dim() >= 2]
    no_decay = [p for p in head.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=args.wd), dict(params=no_decay, weight_decay=0.0)],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(args.seed + 2)
    curve = []
    ev = evaluate(head, rotary, embed, held, hid_held, args, impl)
    curve.append(dict(step=0, **{"heldout_" + k: v for k, v in ev.items()}))
    log(json.dumps(curve[-1]))
    t0 = time.time()
    for step in range(args.steps):
        lr = lr_at(step, args.steps, args.lr, args.warmup, 0.1)
        for gr in opt.param_groups:
            gr["lr"] = lr
        sel = torch.randint(0, args.windows, (args.batch,), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.bf16)):
            loss, parts, _ = step_losses(head, rotary, embed, ids[sel], hid[sel].float(), args, impl)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if (step + 1) % 25 == 0 or step == args.steps - 1:
            rec = dict(step=step + 1, lr=round(lr, 6), gnorm=round(gn.item(), 3), s=round(time.time() - t0, 1),
                       **{k: round(v, 4) for k, v in parts.items()})
            if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
                ev = evaluate(head, rotary, embed, held, hid_held, args, impl)
                rec.update({"heldout_" + k: v for k, v in ev.items()})
            curve.append(rec)
            log(json.dumps(rec))
    t_train = time.time() - t0
    tokens = args.steps * args.batch * (L - 2)
    log(f"trained {args.steps} steps ({tokens} pairs) in {t_train:.0f}s")

    dtype = read_checkpoint(os.path.join(args.model, "model.safetensors"))[0]["model.embed_tokens.weight"].dtype
    head_tensors = published_head_tensors(head, cfg, dtype)
    # held-out numbers of the head as stored (rounded to the checkpoint's dtype)
    stored = MTPHead(cfg, impl)
    load_head_from_checkpoint(stored, head_tensors, cfg)
    final = evaluate(stored, rotary, embed, held, hid_held, args, impl)
    log("held-out, stored head:", json.dumps(final))
    if args.no_write:
        return
    written = write_checkpoint(args.model, head_tensors, {"mtp_num_hidden_layers": 1})
    with open(os.path.abspath(__file__), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    rec = dict(script="tools/train_mtp_head.py", script_sha256=sha, args=vars(args),
               torch=torch.__version__, transformers=transformers.__version__, head_params=nparam,
               train_pairs=tokens, windows=args.windows, window=L, precompute_s=round(t_pre, 1),
               train_s=round(t_train, 1), total_s=round(time.time() - t_all, 1), heldout_windows=nh,
               heldout_final=final, checkpoint=written, curve=curve)
    with open(os.path.join(args.model, "reference", "mtp_train.json"), "w") as f:
        json.dump(rec, f, indent=0)
        f.write("\n")
    log(f"wrote {written['mtp_tensors']} mtp.* tensors; {written['main_tensors']} main tensors unchanged "
        f"(sha256 of their hashes {written['main_tensors_sha256'][:16]}...); model.safetensors "
        f"{written['file_bytes']} bytes")
    if args.qdelta:
        check_qdelta(args, cfg)


if __name__ == "__main__":
    main()
