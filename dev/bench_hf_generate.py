"""Hugging Face `generate` at a batch: the baseline a user would otherwise pick for serving a model, for
dev/bench_serve.sh. Greedy, every sequence exactly MAX_TOKENS new tokens (min_new_tokens), BATCH prompts of
PROMPT random tokens, bf16 on the GPU; medians of ROUNDS timed runs after a warm-up. Prints one JSON line:
output tok/s, the prefill's time (one forward of the prompts) and the mean decode step after it.

    python3 dev/bench_hf_generate.py HF_DIR [--batch 16] [--prompt 512] [--max-tokens 256] [--rounds 3]

HF_DIR: a model in Hugging Face's format (`./hf_convert --export model.bin -o HF_DIR`). Needs torch and
transformers.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("model_dir")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--prompt", type=int, default=512)
parser.add_argument("--max-tokens", type=int, default=256)
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()

model = AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.bfloat16).cuda().eval()
vocab = model.config.vocab_size
generator = torch.Generator().manual_seed(0)
prompts = torch.randint(0, vocab - 1, (args.batch, args.prompt), generator=generator).cuda()
mask = torch.ones_like(prompts)
pad = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def generate():
    model.generate(prompts, attention_mask=mask, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                   do_sample=False, pad_token_id=pad)


with torch.no_grad():
    generate()  # warm-up
    prefill = statistics.median(timed(lambda: model(prompts, attention_mask=mask)) for _ in range(args.rounds))
    total = statistics.median(timed(generate) for _ in range(args.rounds))
print(json.dumps({
    "label": "hf generate", "batch": args.batch, "prompt_tokens": args.prompt, "max_tokens": args.max_tokens,
    "seconds": round(total, 3), "output_tok_per_s": round(args.batch * args.max_tokens / total, 1),
    "prefill_ms": round(1e3 * prefill, 2), "step_ms": round(1e3 * (total - prefill) / args.max_tokens, 3),
}))
