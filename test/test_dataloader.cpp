/*
 Tests for llmc/shard.h and llmc/dataloader.h on small shards in a temporary
 directory: exact round trips, one clear error per kind of corrupt shard,
 batch order, multi-process splits, shuffling, resume, and the states a resume
 refuses (an epoch past the bound among them).
*/
#include "llmc/dataloader.h"
#include "test/test.h"

static void put_le32(FILE* fp, int32_t v) {
    uint8_t b[4];
    shard_put_le32(b, (uint32_t)v);
    fwrite(b, 1, 4, fp);
}

// a hand-made shard: a header with the given fields, then `body` bytes of 0x01
static void write_raw(const char* name, int32_t magic, int32_t version, int32_t n, size_t body) {
    FILE* fp = fopenCheck(tmp_path(name).s, "wb");
    put_le32(fp, magic);
    put_le32(fp, version);
    put_le32(fp, n);
    for (int i = 3; i < SHARD_HEADER_INTS; i++) { put_le32(fp, 0); }
    for (size_t i = 0; i < body; i++) { fputc(1, fp); }
    fcloseCheck(fp);
}

// shard_load of name must fail with a message that names the file and contains want
static void expect_load_error(const char* name, int vocab_size, const char* want) {
    const Path path = tmp_path(name);
    char err[SHARD_ERR_LEN];
    Shard s;
    memset(&s, 0, sizeof(s));
    int rc = shard_load(path.s, vocab_size, &s, err, sizeof(err));
    CHECK(rc == -1, "%s: expected an error", name);
    CHECK(strncmp(err, path.s, strlen(path.s)) == 0 && err[strlen(path.s)] == ':',
          "%s: message does not start with the path: %s", name, err);
    CHECK(strstr(err, want) != NULL, "%s: message '%s' lacks '%s'", name, err, want);
    CHECK(strchr(err, '\n') == NULL, "%s: message is not one line: %s", name, err);
    CHECK(s.num_tokens == 0, "%s: a failed load left %zu tokens", name, s.num_tokens);
    shard_free(&s);
}

// ----------------------------------------------------------------------------

static void test_round_trip(void) {
    // uint16: every boundary value, including 65535
    size_t n = 70000;
    uint32_t* tokens = (uint32_t*)mallocCheck(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) { tokens[i] = (uint32_t)((i * 7919) % 65536); }
    tokens[0] = 65535;
    tokens[1] = 0;
    const Path path16 = tmp_path("rt16.bin");
    shard_write(path16.s, tokens, n, 2);
    CHECK(size_of(path16.s) == 1024 + 2 * (long)n, "uint16 shard is %ld bytes", size_of(path16.s));
    CHECK(!file_exists(tmp_path("rt16.bin.tmp").s), "temporary file left behind");
    // the header bytes are the llm.c ones
    FILE* fp = fopenCheck(path16.s, "rb");
    uint8_t header[12];
    freadCheck(header, 1, 12, fp);
    fcloseCheck(fp);
    CHECK(shard_get_le32(header) == 20240520 && shard_get_le32(header + 4) == 1 &&
          shard_get_le32(header + 8) == (int32_t)n, "uint16 header %d %d %d",
          shard_get_le32(header), shard_get_le32(header + 4), shard_get_le32(header + 8));
    Shard s;
    memset(&s, 0, sizeof(s));
    char err[SHARD_ERR_LEN];
    CHECK(shard_load(path16.s, 65536, &s, err, sizeof(err)) == 0, "uint16 load failed: %s", err);
    CHECK(s.num_tokens == n && s.token_bytes == 2, "uint16: %zu tokens of %d bytes", s.num_tokens, s.token_bytes);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) { bad += shard_token(&s, i) != tokens[i]; }
    CHECK(bad == 0, "uint16: %zu tokens differ", bad);
    ShardInfo info;
    CHECK(shard_read_header(path16.s, &info, err, sizeof(err)) == 0 && info.num_tokens == n && info.token_bytes == 2,
          "uint16 header read: %s", err);

    // uint32: Llama-3 sized ids up to the largest int vocabulary; loaded into the same Shard (buffer reuse)
    size_t m = 1000;
    for (size_t i = 0; i < m; i++) { tokens[i] = (uint32_t)(i * 128255u / (m - 1)); }
    tokens[3] = 0x7FFFFFFEu;
    const Path path32 = tmp_path("rt32.bin");
    shard_write(path32.s, tokens, m, 4);
    CHECK(size_of(path32.s) == 1024 + 4 * (long)m, "uint32 shard is %ld bytes", size_of(path32.s));
    CHECK(shard_load(path32.s, INT32_MAX, &s, err, sizeof(err)) == 0, "uint32 load failed: %s", err);
    CHECK(s.num_tokens == m && s.token_bytes == 4, "uint32: %zu tokens of %d bytes", s.num_tokens, s.token_bytes);
    bad = 0;
    for (size_t i = 0; i < m; i++) { bad += shard_token(&s, i) != tokens[i]; }
    CHECK(bad == 0, "uint32: %zu tokens differ", bad);
    // ...and 0xFFFFFFFE is rejected against the Llama-3 vocabulary
    expect_load_error("rt32.bin", 128256, "token 2147483646 at position 3 is >= vocab size 128256");
    shard_free(&s);
    free(tokens);
}

static void write_big_token(const void* path) {
    uint32_t tokens[3] = {1, 65536, 2};
    shard_write((const char*)path, tokens, 3, 2);
}

static void write_empty(const void* path) {
    shard_write((const char*)path, NULL, 0, 4);
}

static void test_write_errors(void) {
    char out[1024];
    Path path = tmp_path("big_token.bin");
    int rc = run_child(write_big_token, path.s, out, sizeof(out));
    CHECK(rc == 1, "uint16 overflow: exit %d", rc);
    CHECK(strncmp(out, "error: ", 7) == 0 && strstr(out, path.s) && strstr(out, "token 65536 at position 1"),
          "uint16 overflow message: %s", out);
    CHECK(!file_exists(path.s) && !file_exists(tmp_path("big_token.bin.tmp").s), "uint16 overflow left a file");
    path = tmp_path("empty_write.bin");
    rc = run_child(write_empty, path.s, out, sizeof(out));
    CHECK(rc == 1 && strstr(out, "0 tokens"), "empty write: exit %d: %s", rc, out);
}

static void test_corrupt_shards(void) {
    write_raw("bad_magic.bin", 12345, 1, 4, 8);
    expect_load_error("bad_magic.bin", 50257,
                      "bad magic 12345 (expected 20240520 for uint16 or 20240801 for uint32 shards)");
    write_raw("bad_version.bin", SHARD_MAGIC_U16, 3, 4, 8);
    expect_load_error("bad_version.bin", 50257, "bad version 3");
    write_raw("bad_version32.bin", SHARD_MAGIC_U32, 2, 4, 16);
    expect_load_error("bad_version32.bin", 50257, "bad version 2");
    write_raw("mismatch16.bin", SHARD_MAGIC_U16, 7, 4, 8);
    expect_load_error("mismatch16.bin", 50257, "magic 20240520 (uint16 shard) does not match version 7");
    write_raw("mismatch32.bin", SHARD_MAGIC_U32, 1, 4, 16);
    expect_load_error("mismatch32.bin", 50257, "magic 20240801 (uint32 shard) does not match version 1");
    write_raw("truncated.bin", SHARD_MAGIC_U16, 1, 512, 1023);
    expect_load_error("truncated.bin", 50257,
                      ": file is 2047 bytes, header says 512 tokens of 2 bytes = 2048 bytes (truncated?)");
    write_raw("trailing.bin", SHARD_MAGIC_U32, 7, 4, 17);
    expect_load_error("trailing.bin", 50257, "file is 1041 bytes, header says 4 tokens of 4 bytes = 1040 bytes "
                      "(trailing bytes?)");
    write_raw("n_too_big.bin", SHARD_MAGIC_U16, 1, INT32_MAX, 100);
    expect_load_error("n_too_big.bin", 50257, "header says 2147483647 tokens of 2 bytes = 4294968318 bytes");
    write_raw("n_zero.bin", SHARD_MAGIC_U16, 1, 0, 0);
    expect_load_error("n_zero.bin", 50257, "header says 0 tokens");
    write_raw("n_negative.bin", SHARD_MAGIC_U32, 7, -5, 0);
    expect_load_error("n_negative.bin", 50257, "header says -5 tokens");
    FILE* fp = fopenCheck(tmp_path("tiny.bin").s, "wb");
    fputs("not a shard", fp);
    fcloseCheck(fp);
    expect_load_error("tiny.bin", 50257, "file is 11 bytes, smaller than the 1024-byte shard header");
    expect_load_error("missing.bin", 50257, "cannot open");

    // a token past the vocabulary, with the exact message
    uint32_t tokens[2000];
    for (int i = 0; i < 2000; i++) { tokens[i] = (uint32_t)(i % 50257); }
    tokens[1234] = 50300;
    shard_write(tmp_path("bad_token.bin").s, tokens, 2000, 2);
    char want[512];
    snprintf(want, sizeof(want), "%s: token 50300 at position 1234 is >= vocab size 50257", tmp_path("bad_token.bin").s);
    Shard s;
    memset(&s, 0, sizeof(s));
    char err[SHARD_ERR_LEN];
    CHECK(shard_load(tmp_path("bad_token.bin").s, 50257, &s, err, sizeof(err)) == -1 && strcmp(err, want) == 0,
          "bad token message: %s", err);
    // a header-only check does not read tokens, so it accepts this shard
    ShardInfo info;
    CHECK(shard_read_header(tmp_path("bad_token.bin").s, &info, err, sizeof(err)) == 0, "header check: %s", err);
    shard_free(&s);
}

// ----------------------------------------------------------------------------
// data loader tests: shard k (in sorted order) holds token k * TOK_SHARD + i at
// position i, so every token names its shard and position

#define TOK_SHARD 1000000
#define VOCAB (1 << 23)

static void make_shard(const char* name, int k, size_t n, int token_bytes) {
    uint32_t* tokens = (uint32_t*)mallocCheck(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) { tokens[i] = (uint32_t)(k * TOK_SHARD) + (uint32_t)i; }
    shard_write(tmp_path(name).s, tokens, n, token_bytes);
    free(tokens);
}

// the sample id of each row of the current batch (its first input token);
// checks each row is consecutive tokens with targets shifted by one
static void batch_ids(const DataLoader* dl, int* ids) {
    int B = dl->B, T = dl->T, bad = 0;
    for (int b = 0; b < B; b++) {
        const int* in = dl->inputs + b * T;
        const int* tg = dl->targets + b * T;
        ids[b] = in[0];
        for (int t = 0; t < T; t++) {
            bad += in[t] != in[0] + t;
            bad += tg[t] != in[0] + t + 1;
            if (t + 1 < T) { bad += tg[t] != in[t + 1]; }
        }
        bad += (in[0] % TOK_SHARD) % T != 0; // samples start at multiples of T
    }
    CHECK(bad == 0, "batch rows are not consecutive samples with shifted targets (%d mismatches)", bad);
}

// shards: good_train_000001 (97 tokens: 24 samples of T=4), 000002 (121: 30), 000003 (61: 15)
static const size_t shard_tokens[3] = {97, 121, 61};
static Path train_pattern;

static void test_init_errors(void) {
    char err[SHARD_ERR_LEN];
    DataLoader dl;
    Path pattern = tmp_path("nothing_*.bin");
    CHECK(dataloader_try_init(&dl, pattern.s, 2, 4, 0, 1, 0, 0, VOCAB, err, sizeof(err)) == -1 &&
          strstr(err, pattern.s) && strstr(err, "no files match"), "empty glob: %s", err);
    dataloader_free(&dl); // a failed init leaves a loader that can be freed

    make_shard("small_000000.bin", 0, 20, 2);
    pattern = tmp_path("small_*.bin");
    CHECK(dataloader_try_init(&dl, pattern.s, 2, 4, 0, 3, 1, 0, VOCAB, err, sizeof(err)) == -1 &&
          strstr(err, tmp_path("small_000000.bin").s) && strstr(err, "has 20 tokens, fewer than the 25") &&
          strstr(err, "B=2 * T=4 * 3 processes"), "small shard: %s", err);
    // 20 tokens are enough for one process with B=2, T=4 (needs 9)
    CHECK(dataloader_try_init(&dl, pattern.s, 2, 4, 0, 1, 1, 0, VOCAB, err, sizeof(err)) == 0, "small ok: %s", err);
    dataloader_free(&dl);

    CHECK(dataloader_try_init(&dl, pattern.s, 2, 4, 3, 3, 1, 0, VOCAB, err, sizeof(err)) == -1 &&
          strstr(err, "process 3 of 3"), "bad rank: %s", err);

    // a corrupt header anywhere in the glob is caught at init
    pattern = tmp_path("trunc*.bin");
    CHECK(dataloader_try_init(&dl, pattern.s, 1, 4, 0, 1, 0, 0, VOCAB, err, sizeof(err)) == -1 &&
          strstr(err, tmp_path("truncated.bin").s) && strstr(err, "truncated?"), "corrupt at init: %s", err);
}

static void init_bad_token_loader(const void* pattern) {
    DataLoader dl;
    dataloader_init(&dl, (const char*)pattern, 1, 4, 0, 1, 0, 0, 50257);
}

static void next_into_bad_shard(const void* pattern) {
    DataLoader dl;
    dataloader_init(&dl, (const char*)pattern, 1, 4, 0, 1, 0, 0, 100);
    for (size_t i = 0; i < dataloader_num_batches(&dl) + 1; i++) { dataloader_next_batch(&dl); }
    dataloader_free(&dl);
}

static void test_fatal_errors(void) {
    char out[SHARD_ERR_LEN + 64];
    int rc = run_child(init_bad_token_loader, tmp_path("bad_token.bin").s, out, sizeof(out));
    char want[512];
    snprintf(want, sizeof(want), "error: %s: token 50300 at position 1234 is >= vocab size 50257\n",
             tmp_path("bad_token.bin").s);
    CHECK(rc == 1 && strcmp(out, want) == 0, "init with a bad token: exit %d: %s", rc, out);

    // the second shard has a token >= 100: caught when the loader reaches it
    uint32_t tokens[40];
    for (int i = 0; i < 40; i++) { tokens[i] = (uint32_t)i; }
    shard_write(tmp_path("late_000001.bin").s, tokens, 40, 2);
    tokens[17] = 100;
    shard_write(tmp_path("late_000002.bin").s, tokens, 40, 2);
    const Path pattern = tmp_path("late_*.bin");
    rc = run_child(next_into_bad_shard, pattern.s, out, sizeof(out));
    snprintf(want, sizeof(want), "error: %s: token 100 at position 17 is >= vocab size 100\n",
             tmp_path("late_000002.bin").s);
    CHECK(rc == 1 && strcmp(out, want) == 0, "bad token in a later shard: exit %d: %s", rc, out);
}

static void test_unshuffled(void) {
    DataLoader dl;
    dataloader_init(&dl, train_pattern.s, 3, 4, 0, 1, 0, 42, VOCAB);
    CHECK(dataloader_num_tokens(&dl) == 97 + 121 + 61, "num_tokens %zu", dataloader_num_tokens(&dl));
    CHECK(dl.num_shards == 3, "num_shards %zu", dl.num_shards);
    // 24/3 + 30/3 + 15/3 batches of 3 samples
    size_t nb = dataloader_num_batches(&dl);
    CHECK(nb == 8 + 10 + 5, "num_batches %zu", nb);
    int ids[3];
    for (int epoch = 0; epoch < 2; epoch++) {
        int bad = 0;
        size_t batch = 0;
        for (int k = 0; k < 3; k++) {
            size_t samples = (shard_tokens[k] - 1) / 4;
            for (size_t s = 0; s < samples; s += 3, batch++) {
                dataloader_next_batch(&dl);
                batch_ids(&dl, ids);
                for (int b = 0; b < 3; b++) { bad += ids[b] != k * TOK_SHARD + (int)(s + b) * 4; }
                bad += dl.epoch != (uint64_t)epoch;
            }
        }
        CHECK(bad == 0 && batch == nb, "epoch %d: unshuffled order differs (%d)", epoch, bad);
    }
    // reset: back to the first batch of epoch 0
    dataloader_reset(&dl);
    CHECK(dl.epoch == 0, "reset epoch %llu", (unsigned long long)dl.epoch);
    dataloader_next_batch(&dl);
    batch_ids(&dl, ids);
    CHECK(ids[0] == 0 && ids[1] == 4 && ids[2] == 8, "after reset: %d %d %d", ids[0], ids[1], ids[2]);
    dataloader_free(&dl);

    // a uint16 copy reads the same; the remainder that does not fill a batch is skipped
    make_shard("u16_000000.bin", 0, 97, 2);
    const Path pattern = tmp_path("u16_*.bin");
    dataloader_init(&dl, pattern.s, 5, 4, 0, 1, 0, 0, 200);
    CHECK(dataloader_num_batches(&dl) == 4, "uint16 batches %zu", dataloader_num_batches(&dl));
    int bad = 0, ids5[5];
    for (int i = 0; i < 5; i++) {
        dataloader_next_batch(&dl);
        batch_ids(&dl, ids5);
        for (int b = 0; b < 5; b++) { bad += ids5[b] != ((i % 4) * 5 + b) * 4; }
    }
    CHECK(bad == 0 && dl.epoch == 1, "uint16 order (%d), epoch %llu", bad, (unsigned long long)dl.epoch);
    dataloader_free(&dl);
}

// P loaders of B samples each read, rank after rank, exactly what one loader of B*P reads
static void check_processes(int B, int P, int shuffle) {
    DataLoader whole, parts[3];
    dataloader_init(&whole, train_pattern.s, B * P, 4, 0, 1, shuffle, 7, VOCAB);
    for (int r = 0; r < P; r++) { dataloader_init(&parts[r], train_pattern.s, B, 4, r, P, shuffle, 7, VOCAB); }
    size_t nb = dataloader_num_batches(&whole);
    CHECK(dataloader_num_batches(&parts[0]) == nb, "P=%d: %zu vs %zu batches", P,
          dataloader_num_batches(&parts[0]), nb);
    int want[12], got[12];
    int bad = 0, dup = 0;
    for (size_t step = 0; step < 2 * nb + 3; step++) {
        dataloader_next_batch(&whole);
        batch_ids(&whole, want);
        for (int r = 0; r < P; r++) {
            dataloader_next_batch(&parts[r]);
            batch_ids(&parts[r], got + r * B);
            bad += parts[r].epoch != whole.epoch;
        }
        for (int i = 0; i < B * P; i++) {
            bad += got[i] != want[i];
            for (int j = 0; j < i; j++) { dup += got[i] == got[j]; }
        }
    }
    CHECK(bad == 0, "B=%d P=%d shuffle=%d: ranks differ from one process with B*P (%d)", B, P, shuffle, bad);
    CHECK(dup == 0, "B=%d P=%d shuffle=%d: ranks share samples (%d)", B, P, shuffle, dup);
    dataloader_free(&whole);
    for (int r = 0; r < P; r++) { dataloader_free(&parts[r]); }
}

// run n batches, appending every sample id to ids
static void collect(DataLoader* dl, size_t n, int* ids) {
    for (size_t i = 0; i < n; i++) {
        dataloader_next_batch(dl);
        batch_ids(dl, ids + i * (size_t)dl->B);
    }
}

static void test_shuffled(void) {
    DataLoader a, b, c, plain;
    dataloader_init(&a, train_pattern.s, 3, 4, 0, 1, 1, 1234, VOCAB);
    dataloader_init(&b, train_pattern.s, 3, 4, 0, 1, 1, 1234, VOCAB);
    dataloader_init(&c, train_pattern.s, 3, 4, 0, 1, 1, 1235, VOCAB);
    dataloader_init(&plain, train_pattern.s, 3, 4, 0, 1, 0, 1234, VOCAB);
    size_t nb = dataloader_num_batches(&a), per_epoch = nb * 3;
    int* ia = (int*)mallocCheck(2 * per_epoch * sizeof(int));
    int* ib = (int*)mallocCheck(2 * per_epoch * sizeof(int));
    int* ic = (int*)mallocCheck(2 * per_epoch * sizeof(int));
    int* ip = (int*)mallocCheck(2 * per_epoch * sizeof(int));
    collect(&a, 2 * nb, ia);
    collect(&b, 2 * nb, ib);
    collect(&c, 2 * nb, ic);
    collect(&plain, 2 * nb, ip);
    CHECK(memcmp(ia, ib, 2 * per_epoch * sizeof(int)) == 0, "same seed, different batches");
    CHECK(memcmp(ia, ic, per_epoch * sizeof(int)) != 0, "another seed, same batches");
    CHECK(memcmp(ia, ip, per_epoch * sizeof(int)) != 0, "shuffled equals file order");
    CHECK(memcmp(ia, ia + per_epoch, per_epoch * sizeof(int)) != 0, "epoch 1 repeats epoch 0");
    CHECK(a.epoch == 1, "epoch %llu after two epochs", (unsigned long long)a.epoch);
    // every sample exactly once per epoch (all shards here hold a multiple of 3 samples)
    for (int e = 0; e < 2; e++) {
        int seen[3][30];
        memset(seen, 0, sizeof(seen));
        int bad = 0;
        for (size_t i = 0; i < per_epoch; i++) {
            int id = ia[e * per_epoch + i], k = id / TOK_SHARD, s = (id % TOK_SHARD) / 4;
            if (k < 0 || k > 2 || s >= (int)((shard_tokens[k] - 1) / 4)) { bad++; } else { seen[k][s]++; }
        }
        for (int k = 0; k < 3; k++) {
            for (size_t s = 0; s < (shard_tokens[k] - 1) / 4; s++) { bad += seen[k][s] != 1; }
        }
        CHECK(bad == 0, "epoch %d: not every sample exactly once (%d)", e, bad);
    }
    // the shard order is shuffled too: over a few seeds, some epoch does not start with shard 0
    int starts_elsewhere = 0;
    for (uint64_t seed = 0; seed < 8; seed++) {
        DataLoader d;
        dataloader_init(&d, train_pattern.s, 3, 4, 0, 1, 1, seed, VOCAB);
        dataloader_next_batch(&d);
        starts_elsewhere += d.inputs[0] / TOK_SHARD != 0;
        dataloader_free(&d);
    }
    CHECK(starts_elsewhere > 0, "shard order never shuffled");
    free(ia);
    free(ib);
    free(ic);
    free(ip);
    dataloader_free(&a);
    dataloader_free(&b);
    dataloader_free(&c);
    dataloader_free(&plain);
}

static void check_resume(int B, int P, int shuffle) {
    DataLoader ref;
    dataloader_init(&ref, train_pattern.s, B, 4, P - 1, P, shuffle, 99, VOCAB);
    size_t nb = dataloader_num_batches(&ref);
    size_t total = 2 * nb + 2, ahead = 4;
    int* want = (int*)mallocCheck((total + ahead) * (size_t)B * sizeof(int));
    collect(&ref, total + ahead, want);
    // big enough for any collect below
    int* got = (int*)mallocCheck((total + 7) * (size_t)B * sizeof(int));
    int bad = 0;
    // resume after every step, which crosses every shard boundary and the epoch boundary
    for (size_t k = 0; k <= total; k++) {
        DataLoader src, dst;
        dataloader_init(&src, train_pattern.s, B, 4, P - 1, P, shuffle, 99, VOCAB);
        collect(&src, k, got);
        DataLoaderState st = dataloader_get_state(&src);
        // a loader made with another seed and moved elsewhere still continues exactly
        dataloader_init(&dst, train_pattern.s, B, 4, P - 1, P, shuffle, 5, VOCAB);
        collect(&dst, 7, got);
        dataloader_set_state(&dst, &st, "a state");
        collect(&dst, ahead, got);
        int diff = memcmp(got, want + k * (size_t)B, ahead * (size_t)B * sizeof(int)) != 0;
        CHECK(!diff, "B=%d P=%d shuffle=%d: resume after %zu batches differs", B, P, shuffle, k);
        bad += diff;
        dataloader_free(&src);
        dataloader_free(&dst);
    }
    CHECK(bad == 0 && total > nb, "resume checked over %zu steps", total);
    free(want);
    free(got);
    dataloader_free(&ref);
}

// a state written by P processes of batch B resumes in a loader that splits the
// same global batch otherwise (a run moved to another number of GPUs): the
// one-process loader of batch B P continues with what the P processes would
// have read next, and the other way round
static void check_resplit(int B, int P) {
    DataLoader whole;
    dataloader_init(&whole, train_pattern.s, B * P, 4, 0, 1, 1, 7, VOCAB);
    size_t total = 2 * dataloader_num_batches(&whole) + 1;
    int* want = (int*)mallocCheck((total + 4) * (size_t)B * P * sizeof(int));
    collect(&whole, total + 4, want);
    int* got = (int*)mallocCheck((total + 3) * (size_t)B * P * sizeof(int)); // any collect below fits
    int bad = 0;
    for (size_t k = 0; k <= total; k += 3) {
        DataLoader part, one;
        dataloader_init(&part, train_pattern.s, B, 4, P - 1, P, 1, 7, VOCAB);
        collect(&part, k, got);
        DataLoaderState st = dataloader_get_state(&part);
        dataloader_init(&one, train_pattern.s, B * P, 4, 0, 1, 1, 7, VOCAB);
        dataloader_set_state(&one, &st, "a state");
        collect(&one, 3, got);
        bad += memcmp(got, want + k * (size_t)B * P, 3 * (size_t)B * P * sizeof(int)) != 0;
        // and back: rank r of P continues with its part of the next global batch
        st = dataloader_get_state(&one);
        for (int r = 0; r < P; r++) {
            DataLoader back;
            dataloader_init(&back, train_pattern.s, B, 4, r, P, 1, 7, VOCAB);
            dataloader_set_state(&back, &st, "a state");
            collect(&back, 1, got);
            bad += memcmp(got, want + ((k + 3) * P + r) * (size_t)B, (size_t)B * sizeof(int)) != 0;
            dataloader_free(&back);
        }
        dataloader_free(&part);
        dataloader_free(&one);
    }
    CHECK(bad == 0, "B=%d P=%d: %d resumes across process counts differ", B, P, bad);
    free(want);
    free(got);
    dataloader_free(&whole);
}

static void test_state_errors(void) {
    DataLoader dl;
    dataloader_init(&dl, train_pattern.s, 3, 4, 0, 1, 1, 3, VOCAB);
    char err[SHARD_ERR_LEN];
    DataLoaderState st = dataloader_get_state(&dl);
    st.B = 2;
    st.batch_pos = 1; // sample 2 is no multiple of this loader's batches of 3
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == -1 && strstr(err, "sample 2 (batches of 2 x 1") &&
          strstr(err, "not a multiple of this run's 3 x 1"), "B mismatch: %s", err);
    st = dataloader_get_state(&dl);
    st.num_tokens = 1;
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == -1 && strstr(err, "num_tokens is 1"),
          "data mismatch: %s", err);
    st = dataloader_get_state(&dl);
    st.batch_pos = 11;
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == -1 && strstr(err, "batch 11"),
          "corrupt batch_pos: %s", err);
    st = dataloader_get_state(&dl);
    st.shard_pos = 3;
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == -1 && strstr(err, "shard 3 of 3"),
          "corrupt shard_pos: %s", err);
    // a position whose sample count would wrap 64 bits (3 * 2^62 * 4 = 3 * 2^64: 0 mod 2^64)
    st = dataloader_get_state(&dl);
    st.batch_pos = 1ull << 62;
    st.B = 3;
    st.num_processes = 4;
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == -1 && strstr(err, "is past any shard"),
          "wrapping batch_pos: %s", err);
    st.batch_pos = 1;
    st.B = INT32_MAX;
    st.num_processes = INT32_MAX;
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == -1 && strstr(err, "is past any shard"),
          "huge B and process count: %s", err);
    // a refused state leaves the loader where it was
    CHECK(dl.epoch == 0 && dl.shard_pos == 0 && dl.batch_pos == 0 && dl.seed == 3, "refused state moved the loader");
    dataloader_free(&dl);
}

// a state at the end of epoch DL_MAX_EPOCH (the largest a state may hold): one batch before the next epoch
static DataLoaderState state_at_max_epoch(void) {
    DataLoader dl;
    dataloader_init(&dl, train_pattern.s, 3, 4, 0, 1, 1, 3, VOCAB);
    dataloader_seek(&dl, DL_MAX_EPOCH, dl.num_shards - 1, 0);
    dl.batch_pos = dataloader_shard_batches(&dl, dl.shard_order[dl.shard_pos]);
    DataLoaderState st = dataloader_get_state(&dl);
    dataloader_free(&dl);
    return st;
}

static void set_state_past_max_epoch(const void* source) {
    DataLoader dl;
    dataloader_init(&dl, train_pattern.s, 3, 4, 0, 1, 1, 3, VOCAB);
    DataLoaderState st = state_at_max_epoch();
    st.epoch++;
    dataloader_set_state(&dl, &st, (const char*)source);
}

// the epoch is a 64-bit counter: a state at the bound resumes and runs on into the next epoch (as one
// seeked there does); one past the bound, whose run could not go on, is refused, naming the file
static void test_max_epoch(void) {
    DataLoader dl, ref;
    dataloader_init(&dl, train_pattern.s, 3, 4, 0, 1, 1, 3, VOCAB);
    dataloader_init(&ref, train_pattern.s, 3, 4, 0, 1, 1, 3, VOCAB);
    char err[SHARD_ERR_LEN];
    DataLoaderState st = state_at_max_epoch();
    CHECK(dataloader_try_set_state(&dl, &st, err, sizeof(err)) == 0, "a state of epoch DL_MAX_EPOCH: %s", err);
    dataloader_next_batch(&dl);
    dataloader_seek(&ref, DL_MAX_EPOCH + 1, 0, 0);
    dataloader_next_batch(&ref);
    CHECK(dl.epoch == DL_MAX_EPOCH + 1 && dl.shard_pos == 0 && dl.batch_pos == 1 &&
          memcmp(dl.inputs, ref.inputs, 3 * 4 * sizeof(int)) == 0, "the batch after epoch DL_MAX_EPOCH: epoch %llu, "
          "shard %zu, batch %zu", (unsigned long long)dl.epoch, dl.shard_pos, dl.batch_pos);
    st = dataloader_get_state(&dl);
    CHECK(dataloader_try_set_state(&ref, &st, err, sizeof(err)) == -1 &&
          strstr(err, "epoch 4611686018427387905, expected at most 4611686018427387904"), "epoch past the bound: %s", err);
    // freed before the fork: of a prefetch thread still reading, the child keeps the sanitizer's record (a
    // thread it cannot stop: its shard's FILE reported as a leak at the exit) and any allocator lock it held
    // (the child's next allocation waits forever)
    dataloader_free(&dl);
    dataloader_free(&ref);
    expect_child_error(set_state_past_max_epoch, "run/state_00000007_00000.bin",
                       "run/state_00000007_00000.bin: data loader state is corrupt: epoch 4611686018427387905");
}

int main(void) {
    make_tmp_dir("test_dataloader");

    test_round_trip();
    test_write_errors();
    test_corrupt_shards();
    test_fatal_errors();

    // written out of order: the loader sorts the names
    make_shard("good_train_000003.bin", 2, shard_tokens[2], 4);
    make_shard("good_train_000001.bin", 0, shard_tokens[0], 4);
    make_shard("good_train_000002.bin", 1, shard_tokens[1], 4);
    train_pattern = tmp_path("good_train_*.bin");

    test_init_errors();
    test_unshuffled();
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        check_processes(2, 2, shuffle);
        check_processes(2, 3, shuffle);
        check_processes(4, 3, shuffle);
    }
    test_shuffled();
    check_resume(3, 1, 1);
    check_resume(2, 3, 1);
    check_resume(3, 1, 0);
    check_resplit(2, 2);
    check_resplit(1, 3);
    test_state_errors();
    test_max_epoch();

    remove_tmp_dir();
    CHECK(!file_exists(tmp_dir), "temporary directory %s not removed", tmp_dir);
    return test_summary("test_dataloader");
}
