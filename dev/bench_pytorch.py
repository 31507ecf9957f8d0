"""
The PyTorch baseline for our training and prefill throughput: Hugging Face's
LlamaForCausalLM with hidden_act="relu" and the shapes of our presets, fp32
parameters under bf16 autocast, SDPA attention, torch.compile, fused AdamW.
Prints training tokens/s (compiled) and forward-only prefill tokens/s (eager,
no grad), in the same format as dev/bench_train.sh, for the same GPU.

usage: python3 dev/bench_pytorch.py PRESET B T [steps]    e.g. 1.5b 4 2048 10
"""
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

PRESETS = {"default": (4, 256, 4, 704), "124m": (12, 768, 12, 2048), "0.5b": (8, 2048, 32, 5632),
           "1b": (18, 2048, 32, 5632), "1.5b": (28, 2048, 32, 5632), "2b": (38, 2048, 32, 5632)}


def main():
    preset, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    L, D, NH, H = PRESETS[preset]
    config = LlamaConfig(vocab_size=50304, hidden_size=D, intermediate_size=H, num_hidden_layers=L,
                         num_attention_heads=NH, num_key_value_heads=NH, hidden_act="relu",
                         max_position_embeddings=T, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 50257, (B, T), device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    # prefill: forward only, eager, no grad
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(2):
            model(input_ids=ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            model(input_ids=ids)
        torch.cuda.synchronize()
        prefill = B * T * steps / (time.perf_counter() - t0)

    compiled = torch.compile(model)

    def train_step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        train_step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step()
    torch.cuda.synchronize()
    train = B * T * steps / (time.perf_counter() - t0)
    print(f"pytorch {preset} B{B} T{T} ({n_params / 1e6:.0f}M params, {torch.cuda.get_device_name()}): "
          f"train {train:.0f} tok/s (torch.compile, fused AdamW) | prefill {prefill:.0f} tok/s (eager, no grad) | "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
