/*
 Tests for checkpoint files (llmc/checkpoint.h): exact round trips of the model
 and the optimizer state, and one clear error for a checkpoint of another
 config, a truncated file, a wrong magic and a wrong version; crafted headers
 (sizes that would overflow, fields out of bounds, inf and NaN), flipped bytes
 (the checksum), non-finite parameters, version 1 files, an FFN state of an
 older version (fewer ints), a directory, and a
 write that fails (nothing half written left); the config read alone checks
 the size and the checksum first too; XXH64 against the reference;
 also the training log's truncation on resume (llmc/logger.h).
*/
#include "llmc/checkpoint.h"
#include "llmc/logger.h"
#include "llmc/rng.h"
#include "test/test.h"
#include <sys/resource.h>

static GPTConfig small_config(void) {
    GPTConfig c = {300, 384, 2, 16, 4, 2, 40, 32, 10000.0f, 1e-5f, ACT_RELU, 0};
    return c;
}

static float* random_floats(size_t n, uint64_t seed) {
    float* x = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) { x[i] = (float)rng_normal(&seed); }
    return x;
}

static void load_model(const void* path) {
    GPTConfig c;
    free(checkpoint_load_model((const char*)path, &c, NULL));
}

static void read_config(const void* path) {
    checkpoint_read_config((const char*)path, NULL);
}

// loads the optimizer state of `step` in dir for config c, as one process with 24 bytes of loader state
static void load_state_as(const char* dir, int step, const GPTConfig* c) {
    TrainState s;
    char loader[24];
    size_t n = num_parameters(c);
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    int32_t ffn[12 * 2 + 6]; // ffn_state_ints of c's 2 layers
    checkpoint_load_state(dir, step, c, 1, 0, &s, loader, sizeof(loader), m, v, ffn);
    free(m);
    free(v);
}

// path: a checkpoint directory with a state of step 17
static void load_state_other_config(const void* dir) {
    GPTConfig other = small_config();
    other.hidden = 48;
    load_state_as((const char*)dir, 17, &other);
}

// the state file `from` as an older version wrote it, into dir (same name): `ints` FFN state ints (its last ones
// dropped), the checksum made again
static void write_older_state(const char* from, const char* dir, const char* name, int ints) {
    long size = size_of(from);
    char* bytes = (char*)mallocCheck(size);
    FILE* fp = fopenCheck(from, "rb");
    freadCheck(bytes, 1, size, fp);
    fcloseCheck(fp);
    int32_t* h = (int32_t*)bytes;
    size -= 4L * (h[23] - ints);
    h[23] = ints;
    Xxh64 x;
    checkpoint_hash_header(&x, h);
    xxh64_update(&x, bytes + CKPT_HEADER_BYTES, size - CKPT_HEADER_BYTES);
    checkpoint_put_checksum(h, &x);
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fp = fopenCheck(path, "wb");
    fwriteCheck(bytes, 1, size, fp);
    fcloseCheck(fp);
    free(bytes);
}

static void test_round_trip(void) {
    GPTConfig c = small_config();
    size_t n = num_parameters(&c);
    float* params = random_floats(n, 1);
    Path model = tmp_path("model_00000017.bin");
    checkpoint_save_model(model.s, &c, params, 17);
    CHECK(!file_exists(tmp_path("model_00000017.bin.tmp").s), "the temporary file was left behind");
    CHECK(size_of(model.s) == 1024 + (long)(n * sizeof(float)), "model file size %ld", size_of(model.s));
    GPTConfig loaded;
    int step = 0;
    float* back = checkpoint_load_model(model.s, &loaded, &step);
    char msg[256];
    CHECK(!config_mismatch(&loaded, &c, msg, sizeof(msg)), "config changed: %s", msg);
    CHECK(step == 17, "step %d", step);
    CHECK(memcmp(back, params, n * sizeof(float)) == 0, "parameters differ after the round trip");
    free(back);

    float* m = random_floats(n, 2);
    float* v = random_floats(n, 3);
    TrainState s = {17, 4, 32, 3, 1, 0, 0x1234567890abcdefull, 1, 150, 15, 1e-3f, 0.1f, 0};
    char loader[24] = "loader state bytes";
    Path state = tmp_path("state_00000017_00000.bin");
    CHECK(!checkpoint_complete(tmp_dir, 17), "a model file alone is no complete checkpoint");
    const int32_t ffn[12 * 2 + 6] = {1, 64, 32, 128, 0, 256, 16, 0, 12345, 0, 7, 9}; // the FFN choices of c's 2 layers
    checkpoint_save_state(state.s, &c, &s, loader, sizeof(loader), m, v, n, ffn);
    CHECK(checkpoint_complete(tmp_dir, 17), "model and state make a complete checkpoint");
    TrainState s2;
    char loader2[24];
    float* m2 = (float*)mallocCheck(n * sizeof(float));
    float* v2 = (float*)mallocCheck(n * sizeof(float));
    int32_t ffn2[12 * 2 + 6] = {0};
    int ffn_ints = checkpoint_load_state(tmp_dir, 17, &c, 1, 0, &s2, loader2, sizeof(loader2), m2, v2, ffn2);
    CHECK(ffn_ints == ffn_state_ints(2) && memcmp(ffn, ffn2, sizeof(ffn)) == 0, "the FFN state differs after the round trip");
    // states from before the prices' miss (11 ints a layer) and before the cold part's constant (9 and 5 floats
    // of costs) still load, as they were
    Path older = tmp_path("older");
    make_dir(older.s);
    const int older_ints[] = {11 * 2 + 6, 9 * 2 + 5};
    for (int ints : older_ints) {
        write_older_state(state.s, older.s, "state_00000017_00000.bin", ints);
        memset(ffn2, 0, sizeof(ffn2));
        ffn_ints = checkpoint_load_state(older.s, 17, &c, 1, 0, &s2, loader2, sizeof(loader2), m2, v2, ffn2);
        CHECK(ffn_ints == ints && memcmp(ffn, ffn2, ffn_ints * sizeof(int32_t)) == 0 && ffn2[ffn_ints] == 0,
              "an older FFN state of %d ints loads", ints);
    }
    CHECK(s.step == s2.step && s.B == s2.B && s.T == s2.T && s.grad_accum == s2.grad_accum &&
          s.num_processes == s2.num_processes && s.rank == s2.rank && s.sample_rng == s2.sample_rng &&
          s.eval_pending == s2.eval_pending && s.sched_steps == s2.sched_steps && s.sched_warmup == s2.sched_warmup &&
          s.sched_lr == s2.sched_lr && s.sched_final_frac == s2.sched_final_frac, "train state differs after the round trip");
    CHECK(memcmp(loader, loader2, sizeof(loader)) == 0, "loader state differs");
    CHECK(memcmp(m, m2, n * sizeof(float)) == 0 && memcmp(v, v2, n * sizeof(float)) == 0, "moments differ");

    // the errors
    expect_child_error(load_state_other_config, tmp_dir, "is for another model: hidden 40 (checkpoint) vs 48 (this run)");
    Path cut = tmp_path("cut.bin");
    copy_prefix(model.s, cut.s, size_of(model.s) - 4);
    expect_child_error(load_model, cut.s, "truncated");
    copy_prefix(model.s, cut.s, 100);
    expect_child_error(load_model, cut.s, "too short");
    Path bad = tmp_path("bad.bin");
    copy_prefix(model.s, bad.s, size_of(model.s));
    poke(bad.s, 0, 12345);
    expect_child_error(load_model, bad.s, "bad magic 12345");
    copy_prefix(model.s, bad.s, size_of(model.s));
    poke(bad.s, 4, 99);
    expect_child_error(load_model, bad.s, "version 99");
    expect_child_error(load_model, state.s, "expected 20261122 for a model file");
    copy_prefix(model.s, bad.s, size_of(model.s));
    poke(bad.s, 5 * 4, 17); // channels 17 is not a multiple of 4 heads
    expect_child_error(load_model, bad.s, "channels 17 must be a multiple of num_heads 4");
    free(params); free(m); free(v); free(m2); free(v2);
}

// optimizer state written by P processes (ZeRO shards, llmc/zero.h) loads on
// any other number of processes: every rank gets exactly its share
static void test_resharding(void) {
    GPTConfig c = small_config();
    size_t n = num_parameters(&c);
    float* m = random_floats(n, 4);
    float* v = random_floats(n, 5);
    char loader[24] = "position";
    const int counts[] = {1, 2, 3, 5};
    for (int wi = 0; wi < 4; wi++) {
        int writers = counts[wi];
        char dir_name[32];
        snprintf(dir_name, sizeof(dir_name), "shards%d", writers);
        Path dir = tmp_path(dir_name);
        make_dir(dir.s);
        float* model = random_floats(n, 6);
        char path[4096];
        model_path(path, sizeof(path), dir.s, 40);
        checkpoint_save_model(path, &c, model, 40);
        free(model);
        size_t covered = 0;
        for (int r = 0; r < writers; r++) {
            ZeroLayout z;
            zero_layout_init(&z, &c, writers, r);
            covered += z.owned;
            float* pm = (float*)mallocCheck(z.owned * sizeof(float));
            float* pv = (float*)mallocCheck(z.owned * sizeof(float));
            zero_pack(pm, m, &z);
            zero_pack(pv, v, &z);
            TrainState s = {40, 2, 32, 1, writers, r, 99, 0, 0, 0, 0, 0, 0};
            state_path(path, sizeof(path), dir.s, 40, r);
            CHECK(!checkpoint_complete(dir.s, 40) || r == 0, "%d of %d state files make a complete checkpoint", r, writers);
            const int32_t ffn[12 * 2 + 6] = {1, 64, 100 + r, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 200 + r}; // tails sized per rank
            checkpoint_save_state(path, &c, &s, loader, sizeof(loader), pm, pv, z.owned, ffn);
            free(pm);
            free(pv);
            zero_layout_free(&z);
        }
        CHECK(covered == n, "%d shards cover %zu of %zu parameters", writers, covered, n);
        CHECK(checkpoint_complete(dir.s, 40), "all %d state files: complete", writers);
        for (int ri = 0; ri < 4; ri++) {
            int readers = counts[ri];
            for (int r = 0; r < readers; r++) {
                ZeroLayout z;
                zero_layout_init(&z, &c, readers, r);
                float* got_m = (float*)mallocCheck(z.owned * sizeof(float));
                float* got_v = (float*)mallocCheck(z.owned * sizeof(float));
                float* want_m = (float*)mallocCheck(z.owned * sizeof(float));
                float* want_v = (float*)mallocCheck(z.owned * sizeof(float));
                zero_pack(want_m, m, &z);
                zero_pack(want_v, v, &z);
                TrainState s;
                char loader2[24];
                int32_t ffn[12 * 2 + 6] = {0};
                int has_ffn = checkpoint_load_state(dir.s, 40, &c, readers, r, &s, loader2, sizeof(loader2), got_m, got_v, ffn);
                int from = readers == writers ? r : 0; // its own file, or rank 0's when re-sharded
                CHECK(has_ffn && ffn[0] == 1 && ffn[1] == 64 && ffn[2] == 100 + from && ffn[14] == 200 + from,
                      "written by %d, read by rank %d of %d: FFN state of rank %d, want %d", writers, r, readers,
                      ffn[2] - 100, from);
                CHECK(memcmp(got_m, want_m, z.owned * sizeof(float)) == 0 &&
                      memcmp(got_v, want_v, z.owned * sizeof(float)) == 0 && s.num_processes == writers &&
                      memcmp(loader, loader2, sizeof(loader)) == 0,
                      "written by %d, read by rank %d of %d: moments differ", writers, r, readers);
                free(got_m); free(got_v); free(want_m); free(want_v);
                zero_layout_free(&z);
            }
        }
        // a missing rank's file makes the checkpoint incomplete
        if (writers > 1) {
            state_path(path, sizeof(path), dir.s, 40, writers - 1);
            remove(path);
            CHECK(!checkpoint_complete(dir.s, 40), "a checkpoint missing rank %d's state counts as complete", writers - 1);
        }
        for (int r = 0; r < writers; r++) {
            state_path(path, sizeof(path), dir.s, 40, r);
            remove(path);
        }
        model_path(path, sizeof(path), dir.s, 40);
        remove(path);
        rmdir(dir.s);
    }
    free(m);
    free(v);
}

// path: a model file; copies it to "crafted.bin" with header int `index` set to value
static Path crafted(const char* path, int index, int32_t value) {
    Path out = tmp_path("crafted.bin");
    copy_prefix(path, out.s, size_of(path));
    poke(out.s, 4L * index, value);
    return out;
}

// a model file with a valid header of config c (and checksum) followed by `bytes` bytes of zeros
static void write_header_only(const char* path, const GPTConfig* c, uint64_t claimed_params, long bytes) {
    int32_t h[CKPT_HEADER_INTS] = {0};
    h[0] = CKPT_MODEL_MAGIC; h[1] = CKPT_VERSION;
    header_put_config(h, c);
    h[13] = (int32_t)(uint32_t)claimed_params; h[14] = (int32_t)(uint32_t)(claimed_params >> 32);
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(h, 4, CKPT_HEADER_INTS, fp);
    for (long i = 0; i < bytes; i++) { fputc(0, fp); }
    fcloseCheck(fp);
}

static void save_model_with_nan(const void* path) {
    GPTConfig c = small_config();
    float* params = (float*)callocCheck(num_parameters(&c), sizeof(float));
    params[num_parameters(&c) - 1] = NAN; // the last element of final_norm
    checkpoint_save_model((const char*)path, &c, params, 1);
}

// a model write that fails half way (a file size limit, as a full disk does)
static void save_model_too_big(const void* path) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {4096, 4096};
    setrlimit(RLIMIT_FSIZE, &limit);
    GPTConfig c = small_config();
    float* params = (float*)callocCheck(num_parameters(&c), sizeof(float));
    checkpoint_save_model((const char*)path, &c, params, 1);
}

static void test_crafted_headers(void) {
    // XXH64 as the reference implementation (libxxhash) computes it
    const struct { const char* text; uint64_t hash; } vectors[] = {
        {"", 0xef46db3751d8e999ull}, {"a", 0xd24ec4f1a98c6e5bull}, {"abc", 0x44bc2cf5ad770999ull},
        {"The quick brown fox jumps over the lazy dog", 0x0b242d361fda71bcull},
    };
    for (size_t k = 0; k < sizeof(vectors) / sizeof(vectors[0]); k++) {
        Xxh64 x;
        xxh64_init(&x);
        size_t len = strlen(vectors[k].text);
        xxh64_update(&x, vectors[k].text, len / 2); // in two pieces: the streaming
        xxh64_update(&x, vectors[k].text + len / 2, len - len / 2);
        CHECK(xxh64_digest(&x) == vectors[k].hash, "XXH64(\"%s\") = %016llx", vectors[k].text,
              (unsigned long long)xxh64_digest(&x));
    }
    unsigned char bytes[100];
    for (int i = 0; i < 100; i++) { bytes[i] = (unsigned char)i; }
    Xxh64 x;
    xxh64_init(&x);
    for (int i = 0; i < 100; i += 7) { xxh64_update(&x, bytes + i, i + 7 < 100 ? 7 : 100 - i); }
    CHECK(xxh64_digest(&x) == 0x6ac1e58032166597ull, "XXH64 of bytes 0..99 in pieces of 7");

    GPTConfig c = small_config();
    size_t n = num_parameters(&c);
    float* params = random_floats(n, 9);
    Path model = tmp_path("model_00000003.bin");
    checkpoint_save_model(model.s, &c, params, 3);

    // sizes that would overflow: 2056 bytes claiming ~9.2e18 parameters, huge fields, vocab INT_MAX
    Path big = tmp_path("big.bin");
    write_header_only(big.s, &c, 0x7fffffffffffffffull, 1032);
    CHECK(size_of(big.s) == 2056, "the crafted file is %ld bytes", size_of(big.s));
    expect_child_error(load_model, big.s, "header says 9223372036854775807 parameters, its config has");
    GPTConfig huge = c;
    huge.num_layers = 1 << 30; huge.channels = 1 << 16; huge.hidden = 1 << 20;
    write_header_only(big.s, &huge, 0, 1032);
    expect_child_error(load_model, big.s, "num_layers 1073741824 is outside [1, 1024]");
    huge = c;
    huge.num_kv_heads = huge.num_heads = 1 << 30;
    write_header_only(big.s, &huge, 0, 1032);
    expect_child_error(load_model, big.s, "num_heads 1073741824 is outside");
    expect_child_error(load_model, crafted(model.s, 2, INT32_MAX).s, "vocab_size 2147483647 is outside [2, 16777216]");
    expect_child_error(load_model, crafted(model.s, 3, -128).s, "padded_vocab_size -128 must be vocab_size 300 rounded up");
    expect_child_error(load_model, crafted(model.s, 9, INT32_MIN).s, "max_seq_len -2147483648 is outside");
    expect_child_error(load_model, crafted(model.s, 10, (int32_t)float_bits(INFINITY)).s, "rope_theta inf must be in (0, 1e+12]");
    expect_child_error(load_model, crafted(model.s, 10, (int32_t)float_bits(NAN)).s, "rope_theta nan must be in");
    expect_child_error(load_model, crafted(model.s, 11, (int32_t)float_bits(INFINITY)).s, "norm_eps inf must be in (0, 1]");
    expect_child_error(load_model, crafted(model.s, 11, (int32_t)float_bits(-NAN)).s, "norm_eps -nan must be in");
    expect_child_error(load_model, crafted(model.s, 12, -5).s, "step -5 must be >= 0");
    expect_child_error(load_model, crafted(model.s, 100, 7).s, "header int 100 is 7, expected 0");
    expect_child_error(load_model, crafted(model.s, 13, (int32_t)(n + 1)).s, "parameters, its config has");

    // a flipped byte anywhere: the checksum
    Path flipped = tmp_path("flipped.bin");
    copy_prefix(model.s, flipped.s, size_of(model.s));
    FILE* fp = fopenCheck(flipped.s, "r+b");
    fseekCheck(fp, 1024 + 4 * 100 + 1, SEEK_SET);
    int byte = fgetc(fp);
    fseekCheck(fp, 1024 + 4 * 100 + 1, SEEK_SET);
    fputc(byte ^ 0x10, fp);
    fcloseCheck(fp);
    expect_child_error(load_model, flipped.s, "flipped.bin: checksum mismatch");
    expect_child_error(load_model, crafted(model.s, 12, 4).s, "crafted.bin: checksum mismatch"); // the step
    // the config alone (what a run builds its model from before it loads the weights) comes from a file whose
    // size and checksum hold: here a 1024-byte file whose header describes the largest model the bounds allow
    expect_child_error(read_config, flipped.s, "flipped.bin: checksum mismatch");
    GPTConfig largest = {GPT_MAX_VOCAB, GPT_MAX_VOCAB, GPT_MAX_LAYERS, GPT_MAX_CHANNELS, GPT_MAX_HEADS, GPT_MAX_HEADS,
                         GPT_MAX_HIDDEN, GPT_MAX_SEQ_LEN, 10000.0f, 1e-5f, ACT_RELU, 1};
    write_header_only(big.s, &largest, num_parameters(&largest), 0);
    expect_child_error(read_config, big.s, "big.bin: file is 1024 bytes, its header describes 923590304465920 (truncated?)");
    expect_child_error(load_model, big.s, "big.bin: file is 1024 bytes, its header describes 923590304465920 (truncated?)");

    // version 1: no checksum, loads with a one-line note; non-finite parameters are refused by name
    Path v1 = tmp_path("v1.bin");
    copy_prefix(model.s, v1.s, size_of(model.s));
    poke(v1.s, 4, 1);
    poke(v1.s, 4 * CKPT_CHECKSUM, 0);
    poke(v1.s, 4 * (CKPT_CHECKSUM + 1), 0);
    char err[1024];
    int rc = run_child(load_model, v1.s, err, sizeof(err));
    CHECK(rc == 0 && strstr(err, "v1.bin is a version 1 checkpoint: it has no checksum, loaded unverified") != NULL &&
          strchr(err, '\n') == strrchr(err, '\n'), "a version 1 file: exit %d, '%s'", rc, err);
    size_t offsets[NUM_PARAM_TENSORS];
    param_offsets(offsets, &c);
    poke(v1.s, 1024 + 4 * (long)(offsets[P_WQKV] + 5), (int32_t)float_bits(NAN));
    expect_child_error(load_model, v1.s, "v1.bin: wqkv[5] is NaN: a checkpoint's parameters must all be finite");
    poke(v1.s, 1024 + 4 * (long)(offsets[P_WQKV] + 5), 0);
    poke(v1.s, 1024 + 4 * (long)(offsets[P_WO]), (int32_t)float_bits(-INFINITY));
    expect_child_error(load_model, v1.s, "v1.bin: wo[0] is infinite");
    poke(v1.s, 4 * CKPT_CHECKSUM, 1);
    expect_child_error(load_model, v1.s, "a version 1 checkpoint with a checksum");

    // nothing non-finite is written; a failed write names the file and leaves no .tmp
    Path nan_path = tmp_path("nan.bin");
    expect_child_error(save_model_with_nan, nan_path.s, "refusing to write");
    expect_child_error(save_model_with_nan, nan_path.s, "final_norm[15] is NaN");
    CHECK(!file_exists(nan_path.s) && !file_exists(tmp_path("nan.bin.tmp").s), "a refused write left a file");
    Path full = tmp_path("full.bin");
    expect_child_error(save_model_too_big, full.s, "cannot write");
    expect_child_error(save_model_too_big, full.s, "full.bin: File too large"); // (the file it makes, not its .tmp)
    CHECK(!file_exists(full.s) && !file_exists(tmp_path("full.bin.tmp").s), "a failed write left its .tmp behind");

    // a directory is not a checkpoint
    expect_child_error(load_model, tmp_dir, "is a directory, not a regular file");
    free(params);
}

// state files: loader state of another size, bad fields, and a corrupt moment
static void load_state_of(const void* dir) {
    GPTConfig c = small_config();
    load_state_as((const char*)dir, 5, &c);
}

static void save_state_with_nan_moment(const void* dir) {
    GPTConfig c = small_config();
    size_t n = num_parameters(&c);
    float* m = (float*)callocCheck(n, sizeof(float));
    float* v = (float*)callocCheck(n, sizeof(float));
    v[10] = NAN;
    TrainState s = {6, 4, 32, 2, 1, 0, 7, 0, 0, 0, 0, 0, 0};
    char loader[24] = "loader", path[4096];
    state_path(path, sizeof(path), (const char*)dir, 6, 0);
    checkpoint_save_state(path, &c, &s, loader, sizeof(loader), m, v, n, NULL);
}

static void test_crafted_state(void) {
    GPTConfig c = small_config();
    size_t n = num_parameters(&c);
    float* m = random_floats(n, 10);
    float* v = random_floats(n, 11);
    Path dir = tmp_path("crafted_state");
    make_dir(dir.s);
    char path[4096];
    state_path(path, sizeof(path), dir.s, 5, 0);
    TrainState s = {5, 4, 32, 2, 1, 0, 7, 0, 0, 0, 0, 0, 0};
    char loader[20] = "a shorter state";
    checkpoint_save_state(path, &c, &s, loader, sizeof(loader), m, v, n, NULL);
    expect_child_error(load_state_of, dir.s, "20 bytes of data loader state, this build's is 24 bytes");
    char loader24[24] = "loader";
    checkpoint_save_state(path, &c, &s, loader24, sizeof(loader24), m, v, n, NULL);
    Path copy = tmp_path("state_copy.bin");
    copy_prefix(path, copy.s, size_of(path));
    poke(path, 4 * 15, 1 << 20); // B
    expect_child_error(load_state_of, dir.s, "batch 1048576 x seq-len 32 x 2 accumulation x 1 processes, expected");
    copy_prefix(copy.s, path, size_of(copy.s));
    poke(path, 4 * 18, -1);
    expect_child_error(load_state_of, dir.s, "rank 0 of -1 processes, expected");
    copy_prefix(copy.s, path, size_of(copy.s));
    poke(path, 4 * 23, 5);
    expect_child_error(load_state_of, dir.s, "5 ints of FFN state, expected 0, 30, 28, 24, 23, 12 or 6");
    copy_prefix(copy.s, path, size_of(copy.s));
    poke(path, 4 * 29, (int32_t)float_bits(NAN)); // the schedule's peak lr
    expect_child_error(load_state_of, dir.s, "lr schedule (0 steps, warmup 0, lr nan, final fraction 0) is corrupt");
    copy_prefix(copy.s, path, size_of(copy.s));
    poke(path, 4 * 31, 1); // past the fields
    expect_child_error(load_state_of, dir.s, "header int 31 is 1, expected 0");
    copy_prefix(copy.s, path, size_of(copy.s) - 8);
    expect_child_error(load_state_of, dir.s, "its header describes");
    copy_prefix(copy.s, path, size_of(copy.s));
    poke(path, 1024 + 24 + 4 * 10, 0x7fc00000); // m[10] = NaN: the checksum first
    expect_child_error(load_state_of, dir.s, "checksum mismatch");
    expect_child_error(save_state_with_nan_moment, dir.s, "optimizer moment 10 is not finite");
    // a version 1 state loads flagged unverified, and quietly: the caller notes it once its own checks of
    // what the file holds (the data position) passed, so that an error stays one line
    copy_prefix(copy.s, path, size_of(copy.s));
    poke(path, 4, 1);
    poke(path, 4 * CKPT_CHECKSUM, 0);
    poke(path, 4 * (CKPT_CHECKSUM + 1), 0);
    char err[1024];
    int rc = run_child(load_state_of, dir.s, err, sizeof(err));
    CHECK(rc == 0 && err[0] == '\0', "a version 1 state: exit %d, '%s'", rc, err);
    TrainState back;
    char loader_back[24];
    float* m2 = (float*)mallocCheck(n * sizeof(float));
    float* v2 = (float*)mallocCheck(n * sizeof(float));
    checkpoint_load_state(dir.s, 5, &c, 1, 0, &back, loader_back, sizeof(loader_back), m2, v2, NULL);
    CHECK(back.unverified == 1 && memcmp(m2, m, n * sizeof(float)) == 0, "a version 1 state: unverified %d",
          back.unverified);
    copy_prefix(copy.s, path, size_of(copy.s));
    checkpoint_load_state(dir.s, 5, &c, 1, 0, &back, loader_back, sizeof(loader_back), m2, v2, NULL);
    CHECK(back.unverified == 0, "a version 2 state: unverified %d", back.unverified);
    free(m2);
    free(v2);
    remove(path);
    remove(copy.s);
    rmdir(dir.s);
    free(m);
    free(v);
}

// every parameter is owned by exactly one rank, in flat order within a rank,
// and bucket shares are what zero_share says
static void test_zero_layout(int untied_head) {
    GPTConfig c = small_config();
    c.untied_head = untied_head;
    size_t n = num_parameters(&c);
    for (int P = 1; P <= 9; P++) {
        unsigned char* owner = (unsigned char*)callocCheck(n, 1);
        int bad = 0;
        for (int r = 0; r < P; r++) {
            ZeroLayout z;
            zero_layout_init(&z, &c, P, r);
            size_t packed = 0, last_end = 0;
            for (int i = 0; i < z.num_segments; i++) {
                const ZeroSegment* s = &z.segments[i];
                bad += s->packed != packed || s->offset < last_end;
                for (size_t k = 0; k < s->count; k++) { owner[s->offset + k]++; }
                packed += s->count;
                last_end = s->offset + s->count;
            }
            bad += packed != z.owned;
            // (an untied head is one more bucket, of layer -1: reduced after the backward, gathered first)
            CHECK(z.num_buckets == 2 + untied_head + 7 * c.num_layers && z.buckets[z.num_buckets - 1].layer == -1,
                  "P=%d, untied %d: %d buckets", P, untied_head, z.num_buckets);
            zero_layout_free(&z);
        }
        for (size_t i = 0; i < n; i++) { bad += owner[i] != 1; }
        CHECK(bad == 0, "P=%d: %d layout errors", P, bad);
        free(owner);
    }
}

// the config's activation and head ([25], [26]): a SiLU model with an untied head round trips with its
// lm_head; the files written before the fields (0 there) are ReLU and tied; other values are errors; a
// state file of a ReLU run does not resume a SiLU one
static void load_state_silu(const void* dir) {
    GPTConfig silu = small_config();
    silu.activation = ACT_SILU;
    load_state_as((const char*)dir, 17, &silu);
}

static void test_activation_and_head(void) {
    GPTConfig c = small_config();
    c.activation = ACT_SILU;
    c.untied_head = 1;
    size_t n = num_parameters(&c), head = (size_t)c.padded_vocab_size * c.channels;
    GPTConfig tied = c;
    tied.untied_head = 0;
    CHECK(n == num_parameters(&tied) + head, "an untied head adds Vp x D parameters (%zu vs %zu)", n, num_parameters(&tied));
    size_t offsets[NUM_PARAM_TENSORS];
    param_offsets(offsets, &c);
    CHECK(offsets[P_LM_HEAD] == num_parameters(&tied) && output_head(&c) == P_LM_HEAD && output_head(&tied) == P_WTE,
          "lm_head follows final_norm; the head of a tied model is wte");
    float* params = random_floats(n, 21);
    Path model = tmp_path("model_silu.bin");
    checkpoint_save_model(model.s, &c, params, 5);
    GPTConfig loaded;
    float* back = checkpoint_load_model(model.s, &loaded, NULL);
    char msg[256];
    CHECK(!config_mismatch(&loaded, &c, msg, sizeof(msg)) && loaded.activation == ACT_SILU && loaded.untied_head == 1,
          "SiLU, untied: the config round trips (%s)", msg);
    CHECK(memcmp(back, params, n * sizeof(float)) == 0, "SiLU, untied: the parameters (lm_head too) round trip");
    free(back);
    int step = -1;
    GPTConfig header = checkpoint_read_config(model.s, &step);
    CHECK(!config_mismatch(&header, &c, msg, sizeof(msg)) && step == 5, "checkpoint_read_config: the header's config and step");
    // the fields in the header, and a file of before them: [25] and [26] are 0, which is ReLU and tied
    Path silu_tied = tmp_path("model_silu_tied.bin");
    checkpoint_save_model(silu_tied.s, &tied, params, 5);
    FILE* fp = fopenCheck(silu_tied.s, "rb");
    int32_t h[CKPT_HEADER_INTS];
    freadCheck(h, 4, CKPT_HEADER_INTS, fp);
    fcloseCheck(fp);
    CHECK(h[CKPT_ACTIVATION] == 1 && h[CKPT_UNTIED_HEAD] == 0, "the header holds activation %d, untied %d",
          h[CKPT_ACTIVATION], h[CKPT_UNTIED_HEAD]);
    GPTConfig old_config = small_config();
    Path old = tmp_path("model_old.bin");
    checkpoint_save_model(old.s, &old_config, params, 5);
    back = checkpoint_load_model(old.s, &loaded, NULL);
    CHECK(loaded.activation == ACT_RELU && loaded.untied_head == 0, "zeros there: ReLU, tied");
    free(back);
    expect_child_error(load_model, crafted(model.s, CKPT_ACTIVATION, 2).s, "activation 2 is outside [0, 1]");
    expect_child_error(load_model, crafted(model.s, CKPT_UNTIED_HEAD, -1).s, "untied_head -1 is outside [0, 1]");
    // an untied header over a tied file's parameters: the count
    expect_child_error(load_model, crafted(old.s, CKPT_UNTIED_HEAD, 1).s, "parameters, its config has");
    // a state file of a ReLU run does not resume a SiLU one
    Path dir = tmp_path("state_relu");
    make_dir(dir.s);
    char path[4096];
    state_path(path, sizeof(path), dir.s, 17, 0);
    GPTConfig relu_config = small_config();
    size_t nr = num_parameters(&relu_config);
    float* m = random_floats(nr, 22);
    TrainState st = {17, 2, 32, 1, 1, 0, 7, 0, 0, 0, 0, 0, 0};
    char loader[24] = "position";
    checkpoint_save_state(path, &relu_config, &st, loader, sizeof(loader), m, m, nr, NULL);
    expect_child_error(load_state_silu, dir.s, "is for another model: activation (0 relu, 1 silu) 0 (checkpoint) vs 1 (this run)");
    remove(path);
    rmdir(dir.s);
    free(m);
    free(params);
}

static void test_log_truncation(void) {
    Path log = tmp_path("log.jsonl");
    FILE* fp = fopenCheck(log.s, "w");
    for (int step = 0; step <= 5; step++) {
        fprintf(fp, "{\"type\":\"train\",\"step\":%d}\n{\"type\":\"val\",\"step\":%d}\n", step, step);
    }
    fcloseCheck(fp);
    log_truncate_after_step(log.s, 3);
    fp = fopenCheck(log.s, "r");
    char line[256];
    int lines = 0, last = -1;
    while (fgets(line, sizeof(line), fp)) { lines++; last = atoi(strstr(line, "\"step\":") + 7); }
    fcloseCheck(fp);
    CHECK(lines == 8 && last == 3, "kept %d lines up to step %d, expected 8 up to step 3", lines, last);
    log_truncate_after_step(log.s, -1);
    CHECK(size_of(log.s) == 0, "a fresh run should start an empty log");
}

// the newest checkpoint of each kind, why one is incomplete, and a directory standing for its newest model file
static void test_newest(void) {
    GPTConfig c = small_config();
    size_t n = num_parameters(&c);
    float* params = random_floats(n, 20); // (also the moments: any finite values do)
    Path dir = tmp_path("newest");
    make_dir(dir.s);
    char path[4096], why[4200];
    CHECK(!checkpoint_model_file(dir.s, path, sizeof(path)), "an empty directory has a model file");
    TrainState s = {0, 4, 32, 2, 1, 0, 7, 0, 0, 0, 0, 0, 0};
    char loader[24] = "loader";
    for (int step = 10; step <= 30; step += 10) { // 10, 20 complete; 30 a model file alone
        model_path(path, sizeof(path), dir.s, step);
        checkpoint_save_model(path, &c, params, step);
        if (step == 30) { continue; }
        s.step = step;
        state_path(path, sizeof(path), dir.s, step, 0);
        checkpoint_save_state(path, &c, &s, loader, sizeof(loader), params, params, n, NULL);
    }
    state_path(path, sizeof(path), dir.s, 40, 0); // 40: a state file alone
    copy_prefix(tmp_path("newest/state_00000020_00000.bin").s, path, 4096);
    CHECK(checkpoint_newest(dir.s, CKPT_ANY_FILE, INT_MAX) == 40, "newest file %d", checkpoint_newest(dir.s, CKPT_ANY_FILE, INT_MAX));
    CHECK(checkpoint_newest(dir.s, CKPT_MODEL_FILE, INT_MAX) == 30, "newest model file");
    CHECK(checkpoint_newest(dir.s, CKPT_COMPLETE, INT_MAX) == 20, "newest complete checkpoint");
    CHECK(checkpoint_newest(dir.s, CKPT_COMPLETE, 20) == 10, "newest complete checkpoint before 20");
    CHECK(checkpoint_newest(dir.s, CKPT_COMPLETE, 10) == -1, "a complete checkpoint before 10");
    CHECK(checkpoint_incomplete(dir.s, 30, why, sizeof(why)) && strstr(why, "state_00000030_00000.bin is missing"), "%s", why);
    CHECK(checkpoint_incomplete(dir.s, 40, why, sizeof(why)) && strstr(why, "model_00000040.bin is missing"), "%s", why);
    CHECK(!checkpoint_incomplete(dir.s, 20, why, sizeof(why)), "step 20 is incomplete");
    state_path(path, sizeof(path), dir.s, 20, 0);
    copy_prefix(tmp_path("newest/state_00000010_00000.bin").s, path, 100);
    CHECK(checkpoint_incomplete(dir.s, 20, why, sizeof(why)) && strstr(why, "state_00000020_00000.bin is cut short"), "%s", why);
    CHECK(checkpoint_model_file(dir.s, path, sizeof(path)) && strstr(path, "newest/model_00000030.bin"), "%s", path);
    CHECK(checkpoint_model_file("x/y.bin", path, sizeof(path)) && strcmp(path, "x/y.bin") == 0, "a file stands for itself");
    const char* names[] = {"model_00000010.bin", "model_00000020.bin", "model_00000030.bin", "state_00000010_00000.bin",
                           "state_00000020_00000.bin", "state_00000040_00000.bin"};
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir.s, names[i]);
        remove(path);
    }
    rmdir(dir.s);
    free(params);
}

int main(void) {
    make_tmp_dir("test_checkpoint");
    test_round_trip();
    test_crafted_headers();
    test_crafted_state();
    test_zero_layout(0);
    test_zero_layout(1);
    test_activation_and_head();
    test_resharding();
    test_log_truncation();
    test_newest();
    remove_tmp_dir();
    return test_summary("test_checkpoint");
}
