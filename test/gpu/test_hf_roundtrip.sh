#!/usr/bin/env bash
# hf_convert and infer against PyTorch's LlamaForCausalLM (hidden_act relu with a tied head, and silu
# with an untied lm_head): small random HF models with their own BPE tokenizer, saved with
# save_pretrained, converted, run greedily in infer (tokens and logits against HF's), and exported back
# bit for bit; a checkpoint of ours loaded by transformers.
# dev/hf_roundtrip.py does the work and prints the counts. Needs the binaries (make) and python3 with
# torch, transformers and tokenizers; no network.
set -u
cd "$(dirname "$0")/../.." || exit 1
if ! python3 -c "import torch, transformers, tokenizers, safetensors, numpy" 2> /dev/null; then
    echo "FAIL hf_roundtrip: python3 lacks torch, transformers, tokenizers, safetensors or numpy"
    echo "test_hf_roundtrip: 0 passed, 1 failed"
    exit 1
fi
python3 dev/hf_roundtrip.py
