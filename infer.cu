/*
 infer: loads a checkpoint of train_gpt_sparse and generates text.

 The prompt (an argument, a file, or stdin) is encoded with the GPT-2
 tokenizer after an end-of-text token, run through the model once (prefill,
 filling the key/value cache), and then one token at a time is sampled
 (temperature, top-k, top-p, seed) and streamed to stdout until end-of-text,
 the token limit or the model's max_seq_len.

 Backends: the CPU reference path runs everywhere; the GPU path with the TwELL
 sparse kernels is the project's next step.
*/
#include <cuda_runtime.h>
#include <time.h>
#include <unistd.h>

#include "llmc/checkpoint.h"
#include "llmc/cli.h"
#include "llmc/gpt.h"
#include "llmc/sampler.h"
#include "llmc/tokenizer.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// reads all of fp into a malloc'd, NUL-terminated buffer
static char* read_all(FILE* fp, const char* name, size_t* len) {
    size_t cap = 1 << 16, n = 0;
    char* buf = (char*)mallocCheck(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += got;
        if (n + 1 == cap) { cap *= 2; buf = (char*)reallocCheck(buf, cap); }
    }
    if (ferror(fp)) { fatal("cannot read the prompt from %s", name); }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int main(int argc, char** argv) {
    const char* model_path = "out/model_00002000.bin";
    const char* prompt = NULL;
    const char* prompt_file = NULL;
    const char* tokenizer_path = TOKENIZER_DEFAULT_PATH;
    int max_tokens = 256, top_k = 0, seed = 42, quiet = 0;
    float temperature = 1.0f, top_p = 1.0f;
    ArgSpec specs[] = {
        {'m', "model", ARG_STRING, &model_path, 0, 0, "model checkpoint written by train_gpt_sparse", 0},
        {'p', "prompt", ARG_STRING, &prompt, 0, 0, "prompt text (default: stdin if it is not a terminal, else none)", 0},
        {'f', "prompt-file", ARG_STRING, &prompt_file, 0, 0, "read the prompt from this file ('-' = stdin)", 0},
        {'n', "max-tokens", ARG_INT, &max_tokens, 1, 1 << 24, "most tokens to generate", 0},
        {'t', "temperature", ARG_FLOAT, &temperature, 0, 100, "sampling temperature (0 = greedy)", 0},
        {'k', "top-k", ARG_INT, &top_k, 0, 1 << 24, "sample among the k likeliest tokens (0 = all)", 0},
        {0, "top-p", ARG_FLOAT, &top_p, 1e-6, 1, "sample within the smallest set of probability >= p", 0},
        {'s', "seed", ARG_INT, &seed, 0, 2147483647, "sampling seed", 0},
        {0, "tokenizer", ARG_STRING, &tokenizer_path, 0, 0, "GPT-2 rank file", 0},
        {'q', "quiet", ARG_INT, &quiet, 0, 1, "1 = print only the generated text, no prompt or statistics", 0},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    cli_parse(argc, argv, "usage: ./infer [flags]\nGenerates text with a train_gpt_sparse checkpoint.", specs, num_specs);
    if (prompt && prompt_file) { fatal("give the prompt with --prompt or --prompt-file, not both"); }

    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess) { gpus = 0; }

    GPTConfig config;
    int step = 0;
    float* params = checkpoint_load_model(model_path, &config, &step);
    GPT<float, float> model;
    gpt_build(&model, &config, DEVICE_CPU);
    memcpy(model.params, params, model.num_parameters * sizeof(float));
    free(params);

    Tokenizer tok;
    tokenizer_init(&tok, tokenizer_path);
    if (tok.vocab_size != config.vocab_size) {
        fatal("%s has %d tokens but the model %s has vocab_size %d", tokenizer_path, tok.vocab_size, model_path,
              config.vocab_size);
    }

    // the prompt: argument, file, or piped stdin
    size_t prompt_len = 0;
    char* prompt_buf = NULL;
    const char* prompt_name = "--prompt";
    if (prompt_file) {
        FILE* fp = strcmp(prompt_file, "-") == 0 ? stdin : fopenCheck(prompt_file, "rb");
        prompt_name = strcmp(prompt_file, "-") == 0 ? "stdin" : prompt_file;
        prompt_buf = read_all(fp, prompt_name, &prompt_len);
        if (fp != stdin) { fcloseCheck(fp); }
        prompt = prompt_buf;
    } else if (prompt == NULL && !isatty(STDIN_FILENO)) {
        prompt_name = "stdin";
        prompt_buf = read_all(stdin, prompt_name, &prompt_len);
        prompt = prompt_buf;
    } else if (prompt) {
        prompt_len = strlen(prompt);
    } else {
        prompt = "";
    }
    size_t bad = 0;
    if (!utf8_valid(prompt, prompt_len, &bad)) { fatal("the prompt (%s) is not valid UTF-8 at byte %zu", prompt_name, bad); }

    // documents start with end-of-text in the training data, so prompts do too
    size_t n_ids = 0, cap = 0;
    int* ids = NULL;
    tokenizer_push(tok.eot_token, &ids, &n_ids, &cap);
    tokenizer_encode(&tok, prompt, prompt_len, &ids, &n_ids, &cap);
    if ((int)n_ids >= config.max_seq_len) {
        fatal("the prompt is %zu tokens, the model's max_seq_len is %d", n_ids, config.max_seq_len);
    }
    if (!quiet) {
        fprintf(stderr, "model: %s (step %d, %d layers, D %d, H %d) on the CPU reference path%s\n", model_path, step,
                config.num_layers, config.channels, config.hidden,
                gpus ? " (the GPU path is not built yet)" : " (no CUDA GPU present)");
    }

    InferState<float> state;
    infer_state_alloc(&state, &config, (int)n_ids);
    SamplerConfig sampler = {temperature, top_k, top_p};
    uint64_t rng = (uint64_t)seed;
    ProbIndex* scratch = (ProbIndex*)mallocCheck(config.vocab_size * sizeof(ProbIndex));

    if (!quiet) { fwrite(prompt, 1, prompt_len, stdout); }
    double t0 = now_seconds();
    gpt_forward_cached(&model, &state, ids, (int)n_ids, 0);
    double t_prefill = now_seconds();
    int pos = (int)n_ids, generated = 0;
    const char* stop = "token limit";
    while (generated < max_tokens) {
        int token = sample_token(state.logits, config.vocab_size, &sampler, &rng, scratch);
        if (token == tok.eot_token) { stop = "end of text"; break; }
        size_t len = 0;
        const unsigned char* bytes = tokenizer_decode(&tok, token, &len);
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
        generated++;
        if (pos == config.max_seq_len) { stop = "max_seq_len"; break; }
        if (generated < max_tokens) { gpt_forward_cached(&model, &state, &token, 1, pos++); }
    }
    double t_end = now_seconds();
    printf("\n");
    if (!quiet) {
        fprintf(stderr, "prompt %zu tokens in %.1f ms | generated %d tokens at %.1f tok/s | stopped at %s\n", n_ids,
                (t_prefill - t0) * 1000, generated, generated / (t_end - t_prefill), stop);
    }

    free(scratch);
    free(ids);
    free(prompt_buf);
    infer_state_free(&state);
    tokenizer_free(&tok);
    gpt_free(&model);
    return 0;
}
