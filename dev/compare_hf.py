"""
Checks our model against the PyTorch reference: Hugging Face's LlamaForCausalLM
with hidden_act="relu", run in float64.

build/dev/hf_reference writes a random model (our checkpoint format) and our
CPU (fp32) and GPU (bf16) paths' loss, L1 term, logits and gradients on one
batch; this script loads the checkpoint into the HF model, computes the same
loss, CE + lambda * (1/L) sum_l mean_tokens sum_units |h_l| with h the input of
down_proj, and compares.

usage: python3 dev/compare_hf.py DIR     (DIR as given to build/dev/hf_reference)
"""
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAMES = ["wte", "attn_norm", "wqkv", "wo", "ffn_norm", "wg", "wu", "wdT", "final_norm"]


def read_checkpoint(path):
    raw = np.fromfile(path, dtype=np.int32, count=256)
    assert raw[0] == 20261122 and raw[1] == 1, f"{path}: not a model checkpoint"
    V, Vp, L, D, NH, NKV, H, Tmax = (int(x) for x in raw[2:10])
    theta, eps = raw[10:12].view(np.float32)
    cfg = dict(V=V, Vp=Vp, L=L, D=D, NH=NH, NKV=NKV, H=H, Tmax=Tmax, theta=float(theta), eps=float(eps))
    params = np.fromfile(path, dtype=np.float32, offset=1024)
    return cfg, params


def tensor_shapes(c):
    hd = c["D"] // c["NH"]
    qkv = c["D"] + 2 * c["NKV"] * hd
    L, D, H = c["L"], c["D"], c["H"]
    return {"wte": (c["Vp"], D), "attn_norm": (L, D), "wqkv": (L, qkv, D), "wo": (L, D, D), "ffn_norm": (L, D),
            "wg": (L, H, D), "wu": (L, H, D), "wdT": (L, H, D), "final_norm": (D,)}


def split(flat, c):
    out, off = {}, 0
    for name in NAMES:
        shape = tensor_shapes(c)[name]
        size = int(np.prod(shape))
        out[name] = flat[off:off + size].reshape(shape)
        off += size
    assert off == flat.size
    return out


def build_hf(c, p):
    hd = c["D"] // c["NH"]
    config = LlamaConfig(vocab_size=c["Vp"], hidden_size=c["D"], intermediate_size=c["H"],
                         num_hidden_layers=c["L"], num_attention_heads=c["NH"], num_key_value_heads=c["NKV"],
                         head_dim=hd, hidden_act="relu", max_position_embeddings=c["Tmax"],
                         rms_norm_eps=c["eps"], rope_theta=c["theta"], tie_word_embeddings=True,
                         attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(config).double()
    D, KVD = c["D"], c["NKV"] * hd
    t = lambda x: torch.tensor(np.ascontiguousarray(x), dtype=torch.float64)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(t(p["wte"]))
        for l, layer in enumerate(model.model.layers):
            layer.input_layernorm.weight.copy_(t(p["attn_norm"][l]))
            layer.self_attn.q_proj.weight.copy_(t(p["wqkv"][l][:D]))
            layer.self_attn.k_proj.weight.copy_(t(p["wqkv"][l][D:D + KVD]))
            layer.self_attn.v_proj.weight.copy_(t(p["wqkv"][l][D + KVD:]))
            layer.self_attn.o_proj.weight.copy_(t(p["wo"][l]))
            layer.post_attention_layernorm.weight.copy_(t(p["ffn_norm"][l]))
            layer.mlp.gate_proj.weight.copy_(t(p["wg"][l]))
            layer.mlp.up_proj.weight.copy_(t(p["wu"][l]))
            layer.mlp.down_proj.weight.copy_(t(p["wdT"][l].T))
        model.model.norm.weight.copy_(t(p["final_norm"]))
    return model


def hf_grads_flat(model, c):
    hd = c["D"] // c["NH"]
    g = {"wte": model.model.embed_tokens.weight.grad.float().cpu().numpy(), "final_norm": model.model.norm.weight.grad.float().cpu().numpy()}
    layers = model.model.layers
    g["attn_norm"] = np.stack([l.input_layernorm.weight.grad.float().cpu().numpy() for l in layers])
    g["wqkv"] = np.stack([np.concatenate([l.self_attn.q_proj.weight.grad.float().cpu().numpy(), l.self_attn.k_proj.weight.grad.float().cpu().numpy(),
                                          l.self_attn.v_proj.weight.grad.float().cpu().numpy()]) for l in layers])
    g["wo"] = np.stack([l.self_attn.o_proj.weight.grad.float().cpu().numpy() for l in layers])
    g["ffn_norm"] = np.stack([l.post_attention_layernorm.weight.grad.float().cpu().numpy() for l in layers])
    g["wg"] = np.stack([l.mlp.gate_proj.weight.grad.float().cpu().numpy() for l in layers])
    g["wu"] = np.stack([l.mlp.up_proj.weight.grad.float().cpu().numpy() for l in layers])
    g["wdT"] = np.stack([l.mlp.down_proj.weight.grad.float().cpu().numpy().T for l in layers])
    return g


def run_hf(model, c, ids, targets, lam):
    """CE, L1 term, logits [M, V] and gradients (in our layout, float64) of the HF model on a batch"""
    hs = []
    hooks = [l.mlp.down_proj.register_forward_pre_hook(lambda m, inp: hs.append(inp[0])) for l in model.model.layers]
    logits = model(input_ids=ids).logits.reshape(ids.numel(), -1)
    ce = torch.nn.functional.cross_entropy(logits[:, :c["V"]].double(), targets)
    l1 = torch.stack([h.double().abs().sum(-1).mean() for h in hs]).mean()
    (ce + lam * l1).backward()
    for h in hooks:
        h.remove()
    grads = {k: v.astype(np.float64) for k, v in hf_grads_flat(model, c).items()}
    return ce.item(), l1.item(), logits.detach().double().cpu().numpy()[:, :c["V"]], grads


def main():
    out_dir = sys.argv[1]
    c, flat = read_checkpoint(f"{out_dir}/model.bin")
    params = split(flat, c)
    model = build_hf(c, params)

    raw = open(f"{out_dir}/outputs.bin", "rb").read()
    B, T, V, Vp = np.frombuffer(raw, np.int32, 4)
    lam = float(np.frombuffer(raw, np.float32, 1, 16)[0])
    M, off = B * T, 20
    tokens = np.frombuffer(raw, np.int32, M, off); off += 4 * M
    targets = np.frombuffer(raw, np.int32, M, off); off += 4 * M
    n = flat.size
    ours = {}
    for path in ("cpu", "gpu"):
        ce, l1 = np.frombuffer(raw, np.float32, 2, off); off += 8
        logits = np.frombuffer(raw, np.float32, M * Vp, off).reshape(M, Vp); off += 4 * M * Vp
        grads = np.frombuffer(raw, np.float32, n, off); off += 4 * n
        ours[path] = (float(ce), float(l1), logits, split(grads, c))

    ids = torch.tensor(tokens.reshape(B, T), dtype=torch.long)
    tgt = torch.tensor(targets, dtype=torch.long)
    ref = run_hf(model, c, ids, tgt, lam)
    # HF itself in bf16 (weights, activations and gradients), on the GPU when there is one: the
    # error a bf16 implementation of this model has anyway, against which ours is judged
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf_bf16 = run_hf(build_hf(c, params).to(device=device, dtype=torch.bfloat16), c, ids.to(device), tgt.to(device), lam)

    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(("ok   " if ok else "FAIL ") + what)

    def errors(ce_o, l1_o, logits_o, grads_o):
        e = {"ce": abs(ce_o - ref[0]), "l1": abs(l1_o - ref[1]) / ref[1],
             "logits": np.abs(logits_o[:, :V] - ref[2]).max() / np.abs(ref[2]).max()}
        for name in NAMES:
            e[name] = np.linalg.norm(grads_o[name] - ref[3][name]) / max(np.linalg.norm(ref[3][name]), 1e-30)
        return e

    hf_err = errors(*hf_bf16)
    for path, outputs in ours.items():
        for key, err in errors(*outputs).items():
            if path == "cpu":
                # fp32 against fp64: rounding at the 1e-7 level, grown by the depth and the softmax
                limit = 1e-4 if key == "ce" else 2e-4
            else:
                # bf16: at most 1.5x what HF's own bf16 run is off by (plus a floor for tiny errors)
                limit = 1.5 * hf_err[key] + 2e-3
            check(err < limit, f"{path}: {key:10s} err {err:.2e} (limit {limit:.2e}; HF bf16 {hf_err[key]:.2e})")
    print(f"compare_hf: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
