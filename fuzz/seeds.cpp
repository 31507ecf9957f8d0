/*
 Writes the seed corpus of each harness into build/fuzz/seeds/<target>/ (run from the repository
 root): small valid files made by the project's own writers, variants with a field changed, and
 pieces of the repository's files and test data. `make fuzz` starts from these; `make test`
 replays them (and fuzz/regressions/) through the harnesses built with the sanitizers.
*/
#include "fuzz/common.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"
#include "llmc/safetensors.h"
#include "llmc/tokenizer.h"

static const char* seed_dir = "build/fuzz/seeds";

static void put(const char* target, const char* name, const void* data, size_t size) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", seed_dir, target);
    make_dir(path);
    snprintf(path, sizeof(path), "%s/%s/%s", seed_dir, target, name);
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(data, 1, size, fp);
    fcloseCheck(fp);
}

// the whole file at path (malloc'd, *size bytes)
static char* slurp(const char* path, size_t* size) {
    FILE* fp = fopenCheck(path, "rb");
    *size = (size_t)file_size(fp);
    char* data = (char*)mallocCheck(*size + 1);
    freadCheck(data, 1, *size, fp);
    fcloseCheck(fp);
    return data;
}

// the file at from, copied as a seed; at most max bytes of it
static void put_file(const char* target, const char* name, const char* from, size_t max) {
    size_t size;
    char* data = slurp(from, &size);
    put(target, name, data, size < max ? size : max);
    free(data);
}

// the first `lines` lines of the file at path (all of it for lines < 0), malloc'd, *size bytes
static char* slurp_lines(const char* path, int lines, size_t* size) {
    char* data = slurp(path, size);
    size_t end = 0;
    for (int k = 0; lines >= 0 && k < lines && end < *size; end++) { k += data[end] == '\n'; }
    if (lines >= 0) { *size = end; }
    return data;
}

// the first `lines` lines of the file at from
static void put_lines(const char* target, const char* name, const char* from, int lines) {
    size_t size;
    char* data = slurp_lines(from, lines, &size);
    put(target, name, data, size);
    free(data);
}

// a seed that is `base` with the int32 at `index` set to value
static void put_poked(const char* target, const char* name, const char* base, int index, int32_t value) {
    size_t size;
    char* data = slurp(base, &size);
    memcpy(data + 4 * index, &value, 4);
    put(target, name, data, size);
    free(data);
}

// the fixture's eval file, and variants with a header field or example 0's label changed
static void evalset_seeds(void) {
    const char* base = "test/data/eval/hellaswag_fixture.bin";
    put_file("evalset", "fixture.bin", base, SIZE_MAX);
    put_file("evalset", "header_only.bin", base, 1024);
    put_poked("evalset", "many_examples.bin", base, 2, 1000);
    put_poked("evalset", "two_endings.bin", base, 3, 2);
    put_poked("evalset", "small_vocab.bin", base, 4, 100);
    put_poked("evalset", "label_4.bin", base, 256, 4);
}

static void shard_seeds(void) {
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s/tmp_shard.bin", seed_dir);
    uint32_t tokens[64];
    for (int i = 0; i < 64; i++) { tokens[i] = (uint32_t)(i * 797 % 50257); }
    shard_write(tmp, tokens, 64, 2);
    put_file("shard", "u16.bin", tmp, SIZE_MAX);
    put_poked("shard", "u16_bad_count.bin", tmp, 2, 63);
    shard_write(tmp, tokens, 17, 4);
    put_file("shard", "u32.bin", tmp, SIZE_MAX);
    put_poked("shard", "u32_wrong_version.bin", tmp, 1, 1);
    put_file("shard", "corpus_head.bin", "data/corpus_val_000000.bin", 1200);
    remove(tmp);
}

static void dataloader_seeds(void) {
    char shard[512];
    snprintf(shard, sizeof(shard), "%s/tmp_loader.bin", seed_dir);
    uint32_t tokens[FUZZ_SHARD_TOKENS];
    for (size_t i = 0; i < FUZZ_SHARD_TOKENS; i++) { tokens[i] = fuzz_shard_token(i); }
    shard_write(shard, tokens, FUZZ_SHARD_TOKENS, 2);
    const uint8_t configs[][6] = {{0, 7, 0, 0, 1, 5}, {1, 15, 1, 1, 0, 20}, {3, 31, 2, 2, 1, 63}, {2, 3, 0, 0, 0, 40}};
    for (int k = 0; k < 4; k++) {
        FuzzLoaderConfig c = fuzz_loader_config(configs[k]);
        DataLoader dl;
        dataloader_init(&dl, shard, c.B, c.T, c.rank, c.P, c.shuffle, 1234, FUZZ_SHARD_VOCAB);
        for (int b = 0; b < 3 * k; b++) { dataloader_next_batch(&dl); }
        DataLoaderState s = dataloader_get_state(&dl);
        dataloader_free(&dl);
        uint8_t seed[6 + sizeof(s)];
        memcpy(seed, configs[k], 6);
        memcpy(seed + 6, &s, sizeof(s));
        char name[32];
        snprintf(name, sizeof(name), "state%d.bin", k);
        put("dataloader", name, seed, sizeof(seed));
    }
    remove(shard);
}

static void checkpoint_seeds(void) {
    GPTConfig c = fuzz_small_config();
    size_t n = num_parameters(&c);
    float* params = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { params[i] = (float)((int)(i % 17) - 8) / 16.0f; }
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s/tmp_model.bin", seed_dir);
    checkpoint_save_model(tmp, &c, params, 7);
    put_file("checkpoint", "model.bin", tmp, SIZE_MAX);
    // version 1: no checksum, so that mutations of the data reach the checks after it
    size_t size;
    char* v1 = slurp(tmp, &size);
    int32_t one = 1, zero = 0;
    memcpy(v1 + 4, &one, 4);
    memcpy(v1 + 4 * CKPT_CHECKSUM, &zero, 4);
    memcpy(v1 + 4 * (CKPT_CHECKSUM + 1), &zero, 4);
    put("checkpoint", "model_v1.bin", v1, size);
    float inf = INFINITY;
    memcpy(v1 + CKPT_HEADER_BYTES + 4 * 600, &inf, 4);
    put("checkpoint", "model_v1_inf.bin", v1, size);
    free(v1);
    put_poked("checkpoint", "model_huge_vocab.bin", tmp, 2, INT32_MAX);
    TrainState s = {7, 2, 8, 1, 1, 0, 42, 0, 150, 15, 1e-3f, 0.1f, 0};
    DataLoaderState loader;
    memset(&loader, 0, sizeof(loader));
    int32_t ffn[64] = {1, 4, 2}; // (the first of ffn_state_ints(c.num_layers): one layer sparse, W 4, tail 2)
    if (ffn_state_ints(c.num_layers) > 64) { abort(); }
    checkpoint_save_state(tmp, &c, &s, &loader, sizeof(loader), params, params, n, ffn);
    put_file("checkpoint", "state.bin", tmp, SIZE_MAX);
    put_poked("checkpoint", "state_two_writers.bin", tmp, 18, 2);
    remove(tmp);
    free(params);
}

static void tokenizer_seeds(void) {
    // two rank files (the small Llama-3-style one, GPT-2's first 400 ranks); as rank-file seeds the
    // first byte picks the pre-tokenizer, and each is also written as a tokenizer.json
    const char* ranks[] = {"test/data/tokenize/llama3_ranks.tiktoken", TOKENIZER_DEFAULT_PATH};
    const int lines[] = {-1, 400};
    for (int k = 0; k < 2; k++) {
        size_t size;
        char* data = slurp_lines(ranks[k], lines[k], &size);
        char* seed = (char*)mallocCheck(size + 1);
        memcpy(seed + 1, data, size);
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s/tmp_ranks.tiktoken", seed_dir);
        FILE* fp = fopenCheck(tmp, "wb");
        fwriteCheck(data, 1, size, fp);
        fcloseCheck(fp);
        for (int pattern = 0; pattern < 3; pattern++) {
            char name[32], json[512];
            seed[0] = (char)pattern;
            snprintf(name, sizeof(name), "ranks%d_pattern%d", k, pattern);
            put("tokenizer_ranks", name, seed, size + 1);
            Tokenizer t;
            tokenizer_init_pattern(&t, tmp, pattern);
            snprintf(json, sizeof(json), "%s/tmp_tokenizer.json", seed_dir);
            tokenizer_write_json(&t, json);
            snprintf(name, sizeof(name), "ranks%d_pattern%d.json", k, pattern);
            put_file("tokenizer_json", name, json, SIZE_MAX);
            if (k == 0) { put_file("json", name, json, SIZE_MAX); }
            remove(json);
            tokenizer_free(&t);
        }
        remove(tmp);
        free(seed);
        free(data);
    }
}

static void encode_seeds(void) {
    // the texts of the tokenizer test vectors ("text <hex>" lines), for each of the 4 tokenizers
    size_t size;
    char* vectors = slurp("test/data/tokenizer_vectors.txt", &size);
    vectors[size] = '\0';
    int count = 0;
    for (char* line = strstr(vectors, "\ntext "); line != NULL && count < 120; line = strstr(line + 1, "\ntext ")) {
        const char* hex = line + 6;
        size_t len = strspn(hex, "0123456789abcdef") / 2;
        if (len > 2000) { continue; }
        uint8_t* seed = (uint8_t*)mallocCheck(len + 1);
        for (size_t i = 0; i < len; i++) {
            unsigned int byte;
            sscanf(hex + 2 * i, "%2x", &byte);
            seed[1 + i] = (uint8_t)byte;
        }
        seed[0] = (uint8_t)(count % 4);
        char name[32];
        snprintf(name, sizeof(name), "vector%03d", count++);
        put("encode", name, seed, len + 1);
        free(seed);
    }
    free(vectors);
    char* readme = slurp("README.md", &size);
    for (int k = 0; k < 4; k++) {
        size_t at = (size_t)k * size / 4, len = size - at < 3000 ? size - at : 3000;
        uint8_t* seed = (uint8_t*)mallocCheck(len + 1);
        seed[0] = (uint8_t)k;
        memcpy(seed + 1, readme + at, len);
        char name[32];
        snprintf(name, sizeof(name), "readme%d", k);
        put("encode", name, seed, len + 1);
        free(seed);
    }
    free(readme);
    const uint8_t invalid[] = {0, 'a', 0xE2, 0x82, 'b', 0xF0, 0x9F, 0x98, 0x80, 0xC0, 0x80};
    put("encode", "invalid_utf8", invalid, sizeof(invalid));
}

static void json_seeds(void) {
    const char* texts[] = {
        "{\"a\": [1, -2.5e3, true, false, null, \"x\\u00e9\\ud83d\\ude00\"], \"b\": {}}",
        "[0, 1e308, -0.0, 12345678901234567890123456789012345678901234567890123456789012345678901234567890]",
        "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
        "{\"vocab_size\": 49152, \"hidden_size\": 576, \"rope_theta\": 100000.0, \"tie_word_embeddings\": true}",
    };
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof(name), "text%d.json", k);
        put("json", name, texts[k], strlen(texts[k]));
    }
    put_lines("json", "docs_line.json", "test/data/tokenize/docs.jsonl", 1);
}

static void safetensors_seeds(void) {
    float data[24];
    for (int i = 0; i < 24; i++) { data[i] = (float)i / 3.0f - 2.0f; }
    SafeTensorOut ts[] = {
        {"model.embed_tokens.weight", 2, {4, 3}, data, 0},
        {"model.norm.weight", 1, {3}, data + 12, 0},
        {"lm_head.weight", 2, {3, 3}, data + 15, 1},
    };
    const SafeDtype dtypes[] = {ST_F32, ST_BF16, ST_F16};
    const char* names[] = {"f32.safetensors", "bf16.safetensors", "f16.safetensors"};
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s/tmp.safetensors", seed_dir);
    for (int k = 0; k < 3; k++) {
        safetensors_write(tmp, ts, 3, dtypes[k]);
        put_file("safetensors", names[k], tmp, SIZE_MAX);
        if (k == 0) { // its header, for the JSON reader
            size_t size;
            char* file = slurp(tmp, &size);
            uint64_t len;
            memcpy(&len, file, 8);
            put("json", "safetensors_header.json", file + 8, (size_t)len);
            free(file);
        }
    }
    remove(tmp);
}

static void cli_seeds(void) {
    // the arguments, each ending in a NUL
    const char* argv[] = {"-b", "16", "--lr=0.001", "--output", "run1", "-x", "-1", "--norm-eps", "1e-6", "--tokenizer",
                          "t.json"};
    char buf[256];
    size_t len = 0;
    for (size_t k = 0; k < sizeof(argv) / sizeof(argv[0]); k++) {
        size_t n = strlen(argv[k]) + 1;
        memcpy(buf + len, argv[k], n);
        len += n;
    }
    put("cli", "flags", buf, len - 1);
    put("cli", "help", "--help", 6);
    put("cli", "twice", "-b\0" "2\0" "--batch=3", 13);
    put("cli", "switch", "--serve\0" "-b\0" "4\0" "--serve=1", 22);
}

static void serve_request_seeds(void) {
    const char* bodies[] = {
        "{\"prompt\": \"The sea\"}",
        "{\"model\":\"model_00000001\",\"prompt\":\"a\\u0000b\\ud83d\\ude00\",\"max_tokens\":64,\"temperature\":0,"
        "\"top_p\":0.5,\"top_k\":3,\"seed\":-5,\"stop\":[\"x\",\"yz\"],\"stream\":true,\"stream_options\":"
        "{\"include_usage\":true},\"n\":1,\"best_of\":null,\"echo\":false,\"logprobs\":null,\"suffix\":null,"
        "\"frequency_penalty\":0,\"presence_penalty\":0.0,\"logit_bias\":{},\"user\":\"u\"}",
        "{\"prompt\":\"x\",\"stop\":\"end\",\"max_tokens\":null,\"seed\":null}",
        "{\"prompt\": [\"a\"], \"max_tokens\": 0}",
        "{\"prompt\":\"x\",\"model\":\"gpt-4\"}",
        "{\"prompt\":\"x\",\"temperature\":2.5e0,\"unknown\":[1,{}]}",
    };
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "body%zu.json", i);
        put("serve_request", name, bodies[i], strlen(bodies[i]));
    }
}

int main(void) {
    make_dir(seed_dir);
    shard_seeds();
    evalset_seeds();
    dataloader_seeds();
    checkpoint_seeds();
    tokenizer_seeds();
    encode_seeds();
    json_seeds();
    safetensors_seeds();
    cli_seeds();
    serve_request_seeds();
    printf("fuzz seeds written to %s/\n", seed_dir);
    return 0;
}
