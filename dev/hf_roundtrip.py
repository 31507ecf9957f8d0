"""
Checks hf_convert and infer against PyTorch: Hugging Face's LlamaForCausalLM, with hidden_act="relu" and a
tied head (our sparse models), and with hidden_act="silu" and an untied lm_head (the dense Llamas that
train_gpt_sparse --init-from sparsifies).

1. Two byte-level BPE tokenizers are trained on a few sentences with the tokenizers library: GPT-2's
   layout (ByteLevel, every byte in the alphabet) and SmolLM2's (Digits(individual_digits) then
   ByteLevel, and only the bytes the sentences use). hf_convert --encode must give the ids of
   tokenizers on many strings (digits, accents, emoji, whitespace runs, bytes missing from the
   vocabulary) for both.
2. A small random LlamaForCausalLM(hidden_act="relu", tie_word_embeddings=True, GQA, rope_theta
   100000, random norm weights) with the SmolLM2-style tokenizer is saved in bf16 with save_pretrained,
   in one file and in shards; hf_convert --import turns both into the same checkpoint of ours.
3. ./infer (greedy, CPU path, fp32) on a prompt: its tokens must be HF generate(do_sample=False)'s,
   and the logits it sampled from (--dump-logits) HF's in fp32 (the same bf16 weights) within 1e-3
   of the largest logit, which is well inside bf16's rounding (2^-8 relative). With a GPU, ./infer's
   GPU path (bf16 activations) too, within 3e-2.
4. hf_convert --export --dtype bf16 back to HF: every tensor equal to the saved one, bit for bit;
   transformers loads the export and gives the same logits; AutoTokenizer loads its tokenizer.
5. The same for a LlamaForCausalLM(hidden_act="silu", tie_word_embeddings=False) (an lm_head of its
   own): hf_convert --import says silu and untied, infer's greedy tokens and logits match HF's (CPU,
   and GPU with bf16 tolerance), and the bf16 export gives back every tensor, lm_head too, bit for bit.
6. A checkpoint trained by ./train_gpt_sparse (GPT-2 vocabulary) exported to HF: transformers' logits
   match infer's, and tokenizers reads the exported tokenizer.json with the rank file's ids.

usage: python3 dev/hf_roundtrip.py   (from the repository root, after make; test/gpu/test_hf_roundtrip.sh)
Prints "test_hf_roundtrip: N passed, M failed".
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my purse,",
    "In the beginning God created the heaven and the earth. And the earth was without form, and void;",
    "The year 1790 saw 13 states; by 1800 there were 16, and the census counted 5,308,483 people.",
    "Mr. Bennet's property consisted almost entirely in an estate of two thousand a year, which, unfortunately",
    "She was the youngest of the two daughters of a most affectionate, indulgent father; and had, in consequence",
    "\tIndented lines,\n\nblank lines and    runs of spaces;   it's what we'd expect they'll see.",
] * 4

TEST_STRINGS = [
    "", "a", "the", " the", "It is a truth", "1790", "12 345 6789", "3.14159", "5,308,483 people",
    "don't won't it's we'd they'll I'M", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\n\n",
    "caf\u00e9 na\u00efve \u00e9t\u00e9", "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
    "\u4e2d\u6587\u5b57\u7b26", "emoji \U0001F600\U0001F44D\U0001F3FD", "\u0663\u0664 \u00b2\u00b3 \u216b \u00bd",
    "Mr. Bennet's property", "!!! ??? ... --- ***", "ALL CAPS AND lower", "x\u00a0y\u3000z\u2028w", "\U00040000\U00080000",
    "In the beginning God created the heaven and the earth.", "\r\n\r\n", "a" * 300, "ab" * 50 + " 0123456789" * 3,
]

PROMPT = "It is a truth universally acknowledged, that 1790"

passed = failed = 0


def check(ok, what):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(("ok   " if ok else "FAIL ") + what, flush=True)


def run(*args):
    """runs a binary of the repository; returns (exit code, stdout, stderr)"""
    p = subprocess.run(list(args), capture_output=True, text=True, errors="replace")  # tokens can split a character
    return p.returncode, p.stdout, p.stderr


def train_tokenizer(smollm):
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if smollm:  # SmolLM2's pre-tokenizer, and an alphabet of only the bytes the text has
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False)
    else:
        tok.pre_tokenizer = byte_level
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainer)
    return tok


def check_encodings(name, tok, path):
    bad = []
    for s in TEST_STRINGS:
        rc, out, err = run("./hf_convert", "--tokenizer", path, "--encode", s)
        ours = [int(x) for x in out.split()] if rc == 0 else None
        if ours != tok.encode(s, add_special_tokens=False).ids:
            bad.append((s, ours, tok.encode(s, add_special_tokens=False).ids, err.strip()))
    for s, ours, theirs, err in bad[:3]:
        print(f"     {s!r}: ours {ours} {err}, tokenizers {theirs}")
    check(not bad, f"{name}: hf_convert --encode gives tokenizers' ids on {len(TEST_STRINGS) - len(bad)}/{len(TEST_STRINGS)} strings")


def random_llama(V, hidden_act, tied, seed):
    """a small random LlamaForCausalLM in bf16 (GQA, rope_theta 100000, norm weights other than 1, so that a
    swapped norm would show)"""
    rope = ({"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}
            if int(transformers.__version__.split(".")[0]) >= 5 else {"rope_theta": 100000.0})
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, hidden_act=hidden_act, max_position_embeddings=128,
                      rms_norm_eps=1e-5, tie_word_embeddings=tied, attention_bias=False, mlp_bias=False,
                      bos_token_id=0, eos_token_id=0, initializer_range=0.1, **rope)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model.to(torch.bfloat16)


def read_dump(path, V):
    """infer --dump-logits: per sampled token an int32 id and V float32 logits"""
    rec = np.dtype([("id", "<i4"), ("logits", "<f4", (V,))])
    d = np.fromfile(path, dtype=rec)
    return [int(i) for i in d["id"]], d["logits"]


def compare_generation(name, model, ours_model, tokenizer_path, doc_token, prompt_ids, V, n_new, work, device="cpu",
                       limit=1e-3):
    """infer's greedy tokens and logits on `device` against HF's generate and forward (fp32). limit: largest
    logit error relative to the largest logit (the CPU path is fp32; the GPU path rounds to bf16 at every
    layer), also the near-tie margin within which the two may pick different tokens"""
    name = f"{name} ({device})"
    dump = os.path.join(work, f"{name}.logits")
    rc, out, err = run("./infer", "-m", ours_model, "--tokenizer", tokenizer_path, "-p", PROMPT, "-t", "0",
                       "-n", str(n_new), "-q", "1", "--dump-logits", dump, "--device", device)
    check(rc == 0, f"{name}: infer exits 0 {err.strip()[-200:] if rc else ''}")
    if rc != 0:
        return
    ours_ids, ours_logits = read_dump(dump, V)
    full = [doc_token] + prompt_ids
    with torch.no_grad():
        gen = model.generate(torch.tensor([full]), attention_mask=torch.ones(1, len(full), dtype=torch.long),
                             max_new_tokens=n_new, do_sample=False, num_beams=1, eos_token_id=doc_token,
                             pad_token_id=doc_token)
    hf_ids = gen[0, len(full):].tolist()
    with torch.no_grad():
        ref = model(torch.tensor([full + hf_ids])).logits[0].double().numpy()
    # the same tokens; a divergence is only excused at a near tie of HF's two best logits
    same = ours_ids == hf_ids
    n = 0
    while n < min(len(ours_ids), len(hf_ids)) and ours_ids[n] == hf_ids[n]:
        n += 1
    if not same and n < min(len(ours_ids), len(hf_ids)):
        row = ref[len(full) - 1 + n]
        gap = row[hf_ids[n]] - row[ours_ids[n]]
        same = gap < limit / 10 * max(1.0, np.abs(row).max())
        print(f"     tokens differ at step {n}: ours {ours_ids[n]}, HF {hf_ids[n]}, HF's logit gap {gap:.2e}")
    check(same, f"{name}: greedy tokens equal HF generate's ({len(hf_ids)} tokens: {hf_ids[:12]}...)")
    # the logits each of our tokens was sampled from, where both saw the same tokens
    steps = max(1, n)
    ours = ours_logits[:steps].astype(np.float64)
    theirs = ref[len(full) - 1:len(full) - 1 + steps]
    scale = np.abs(theirs).max()
    err = np.abs(ours - theirs).max() / scale
    check(err < limit, f"{name}: logits of {steps} steps match HF fp32: max err {err:.2e} of the largest logit "
                       f"(limit {limit:.0e}; bf16 rounds at {2 ** -8:.1e})")


def main():
    if not os.path.exists("./hf_convert") or not os.path.exists("./infer"):
        print("error: build first (make); run from the repository root")
        print("test_hf_roundtrip: 0 passed, 1 failed")
        return 1
    work = tempfile.mkdtemp(prefix="hf_roundtrip_")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, work dir {work}")

    # 1. tokenizers
    toks = {}
    for smollm in (False, True):
        name = "SmolLM2-style tokenizer" if smollm else "GPT-2-style tokenizer"
        tok = train_tokenizer(smollm)
        path = os.path.join(work, f"tokenizer_{int(smollm)}.json")
        tok.save(path)
        toks[smollm] = (tok, path)
        check_encodings(name, tok, path)
    tok = toks[True][0]
    V = tok.get_vocab_size()
    vocab = tok.get_vocab()
    print(f"SmolLM2-style tokenizer: {V} tokens, {sum(c not in vocab for c in pre_tokenizers.ByteLevel.alphabet())} bytes without one")

    # 2. the HF model, saved in bf16, one file and shards
    model = random_llama(V, "relu", True, 0)
    hf_dir, shard_dir = os.path.join(work, "hf"), os.path.join(work, "hf_sharded")
    model.save_pretrained(hf_dir)
    model.save_pretrained(shard_dir, max_shard_size="100KB")
    for d in (hf_dir, shard_dir):
        tok.save(os.path.join(d, "tokenizer.json"))
    n_shards = len([f for f in os.listdir(shard_dir) if f.endswith(".safetensors")])
    print(f"saved {hf_dir} and {shard_dir} ({n_shards} shards); config: "
          f"{ {k: v for k, v in json.load(open(os.path.join(hf_dir, 'config.json'))).items() if 'rope' in k} }")

    ours_dir, ours_sharded = os.path.join(work, "ours"), os.path.join(work, "ours_sharded")
    rc, out, err = run("./hf_convert", "--import", hf_dir, "-o", ours_dir)
    print(out + err, end="")
    check(rc == 0 and "rope_theta 100000" in out, "hf_convert --import of the save_pretrained directory")
    rc2, _, err2 = run("./hf_convert", "--import", shard_dir, "-o", ours_sharded)
    read = lambda d: open(os.path.join(d, "model.bin"), "rb").read()
    same = rc2 == 0 and read(ours_dir) == read(ours_sharded)
    check(same and n_shards > 1, f"the {n_shards} shards import to the same checkpoint {err2.strip()}")
    if rc != 0:
        print(f"test_hf_roundtrip: {passed} passed, {failed} failed")
        return 1

    # 3. infer against HF, fp32 on both sides
    ref = LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").float().eval()
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    compare_generation("SmolLM2-style model", ref, os.path.join(ours_dir, "model.bin"), os.path.join(ours_dir, "tokenizer.json"),
                       tok.token_to_id("<|endoftext|>"), prompt_ids, V, 40, work)
    if torch.cuda.is_available():
        compare_generation("SmolLM2-style model", ref, os.path.join(ours_dir, "model.bin"),
                           os.path.join(ours_dir, "tokenizer.json"), tok.token_to_id("<|endoftext|>"), prompt_ids, V, 40,
                           work, device="cuda", limit=3e-2)

    # 4. back to HF, bit for bit
    back = os.path.join(work, "back")
    rc, out, err = run("./hf_convert", "--export", os.path.join(ours_dir, "model.bin"), "--tokenizer",
                       os.path.join(ours_dir, "tokenizer.json"), "--dtype", "bf16", "-o", back)
    check(rc == 0, f"hf_convert --export --dtype bf16 {err.strip()}")
    a, b = load_file(os.path.join(hf_dir, "model.safetensors")), load_file(os.path.join(back, "model.safetensors"))
    a.pop("lm_head.weight", None)
    diff = sorted(set(a) ^ set(b)) + [k for k in a if k in b and (a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k]))]
    check(not diff, f"the exported tensors are the saved ones, bit for bit ({len(b)} tensors)"
                    + (f"; these differ: {diff[:4]}" if diff else ""))
    reloaded = LlamaForCausalLM.from_pretrained(back, attn_implementation="eager").float().eval()
    x = torch.tensor([[0] + prompt_ids])
    with torch.no_grad():
        same = torch.equal(ref(x).logits, reloaded(x).logits)
    check(same, "transformers loads the export and gives the same logits")
    try:
        hf_tok = AutoTokenizer.from_pretrained(back)
        ok = hf_tok(PROMPT, add_special_tokens=False)["input_ids"] == prompt_ids
        check(ok, f"AutoTokenizer loads the exported tokenizer ({type(hf_tok).__name__}) with the same ids")
    except Exception as e:  # a failure to load is a failed check, with the reason
        check(False, f"AutoTokenizer loads the exported tokenizer: {e!r}"[:300])

    # 5. a SiLU model with an untied head, as most dense Llama checkpoints are
    silu_model = random_llama(V, "silu", False, 1)
    check(not torch.equal(silu_model.lm_head.weight, silu_model.model.embed_tokens.weight), "the SiLU model's lm_head is its own")
    silu_dir, ours_silu = os.path.join(work, "hf_silu"), os.path.join(work, "ours_silu")
    silu_model.save_pretrained(silu_dir)
    tok.save(os.path.join(silu_dir, "tokenizer.json"))
    rc, out, err = run("./hf_convert", "--import", silu_dir, "-o", ours_silu)
    print(out + err, end="")
    check(rc == 0 and "hidden_act silu" in out and ", untied head" in out, "hf_convert --import of a SiLU model with an untied head")
    if rc == 0:
        silu_ref = LlamaForCausalLM.from_pretrained(silu_dir, attn_implementation="eager").float().eval()
        silu_ckpt, silu_tok = os.path.join(ours_silu, "model.bin"), os.path.join(ours_silu, "tokenizer.json")
        compare_generation("SiLU, untied head", silu_ref, silu_ckpt, silu_tok, tok.token_to_id("<|endoftext|>"), prompt_ids,
                           V, 40, work)
        if torch.cuda.is_available():
            compare_generation("SiLU, untied head", silu_ref, silu_ckpt, silu_tok, tok.token_to_id("<|endoftext|>"),
                               prompt_ids, V, 40, work, device="cuda", limit=3e-2)
        silu_back = os.path.join(work, "silu_back")
        rc, out, err = run("./hf_convert", "--export", silu_ckpt, "--tokenizer", silu_tok, "--dtype", "bf16", "-o", silu_back)
        check(rc == 0, f"hf_convert --export --dtype bf16 of the SiLU model {err.strip()}")
        a, b = load_file(os.path.join(silu_dir, "model.safetensors")), load_file(os.path.join(silu_back, "model.safetensors"))
        diff = sorted(set(a) ^ set(b)) + [k for k in a if k in b and (a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k]))]
        check(not diff and "lm_head.weight" in b, f"SiLU: the exported tensors are the saved ones, lm_head too, bit for bit "
                                                  f"({len(b)} tensors)" + (f"; these differ: {diff[:4]}" if diff else ""))
        exported_cfg = json.load(open(os.path.join(silu_back, "config.json")))
        check(exported_cfg["hidden_act"] == "silu" and exported_cfg["tie_word_embeddings"] is False,
              "SiLU: the exported config.json says silu and untied")
        reloaded = LlamaForCausalLM.from_pretrained(silu_back, attn_implementation="eager").float().eval()
        with torch.no_grad():
            same = torch.equal(silu_ref(x).logits, reloaded(x).logits)
        check(same, "SiLU: transformers loads the export and gives the same logits")

    # 6. a checkpoint of ours, GPT-2 vocabulary, into HF
    run_dir, exported = os.path.join(work, "run"), os.path.join(work, "exported")
    rc, out, err = run("./train_gpt_sparse", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--hidden", "128",
                       "-t", "64", "-b", "4", "-x", "20", "-v", "0", "-s", "0", "-n", "20", "--device", "cpu", "-o", run_dir)
    check(rc == 0, "train_gpt_sparse writes a checkpoint")
    ckpt = os.path.join(run_dir, "model_00000020.bin")
    rc, out, err = run("./hf_convert", "--export", ckpt, "-o", exported)
    check(rc == 0, f"hf_convert --export of our checkpoint (GPT-2 rank file) {err.strip()}")
    gpt2 = Tokenizer.from_file(os.path.join(exported, "tokenizer.json"))
    bad = []
    for s in TEST_STRINGS:
        rc, out, _ = run("./hf_convert", "--encode", s)
        if [int(t) for t in out.split()] != gpt2.encode(s, add_special_tokens=False).ids:
            bad.append(s)
    check(not bad, f"tokenizers reads the exported tokenizer.json with the rank file's ids ({len(bad)} strings differ)")
    ours_model = LlamaForCausalLM.from_pretrained(exported, attn_implementation="eager").float().eval()
    compare_generation("our checkpoint in transformers", ours_model, ckpt, "data/r50k_base.tiktoken", 50256,
                       gpt2.encode(PROMPT, add_special_tokens=False).ids, 50257, 20, work)

    print(f"test_hf_roundtrip: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
