/*
 Tests for checkpoint files (llmc/checkpoint.h): exact round trips of the model
 and the optimizer state, and one clear error for a checkpoint of another
 config, a truncated file, a wrong magic and a wrong version; also the
 training log's truncation on resume (llmc/logger.h).
*/
#include "llmc/checkpoint.h"
#include "llmc/logger.h"
#include "llmc/rng.h"
#include "test/test.h"

static GPTConfig small_config(void) {
    GPTConfig c = {300, 384, 2, 16, 4, 2, 40, 32, 10000.0f, 1e-5f};
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

// path: a checkpoint directory with a state of step 17
static void load_state_other_config(const void* dir) {
    GPTConfig other = small_config();
    other.hidden = 48;
    TrainState s;
    char loader[24];
    size_t n = num_parameters(&other);
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    int32_t ffn[3 * 2];
    checkpoint_load_state((const char*)dir, 17, &other, 1, 0, &s, loader, sizeof(loader), m, v, ffn);
}

// overwrites 4 bytes at offset
static void poke(const char* path, long offset, int32_t value) {
    FILE* fp = fopenCheck(path, "r+b");
    fseekCheck(fp, offset, SEEK_SET);
    fwriteCheck(&value, 4, 1, fp);
    fcloseCheck(fp);
}

static void copy_prefix(const char* from, const char* to, long bytes) {
    FILE* in = fopenCheck(from, "rb");
    FILE* out = fopenCheck(to, "wb");
    for (long i = 0; i < bytes; i++) { fputc(fgetc(in), out); }
    fcloseCheck(in);
    fcloseCheck(out);
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
    TrainState s = {17, 4, 32, 3, 1, 0, 0x1234567890abcdefull, 1};
    char loader[24] = "loader state bytes";
    Path state = tmp_path("state_00000017_00000.bin");
    CHECK(!checkpoint_complete(tmp_dir, 17), "a model file alone is no complete checkpoint");
    const int32_t ffn[3 * 2] = {1, 64, 32, 0, 256, 16}; // the FFN choices of c's 2 layers
    checkpoint_save_state(state.s, &c, &s, loader, sizeof(loader), m, v, n, ffn);
    CHECK(checkpoint_complete(tmp_dir, 17), "model and state make a complete checkpoint");
    TrainState s2;
    char loader2[24];
    float* m2 = (float*)mallocCheck(n * sizeof(float));
    float* v2 = (float*)mallocCheck(n * sizeof(float));
    int32_t ffn2[3 * 2] = {0};
    int has_ffn = checkpoint_load_state(tmp_dir, 17, &c, 1, 0, &s2, loader2, sizeof(loader2), m2, v2, ffn2);
    CHECK(has_ffn && memcmp(ffn, ffn2, sizeof(ffn)) == 0, "the FFN state differs after the round trip");
    CHECK(s.step == s2.step && s.B == s2.B && s.T == s2.T && s.grad_accum == s2.grad_accum &&
          s.num_processes == s2.num_processes && s.rank == s2.rank && s.sample_rng == s2.sample_rng &&
          s.eval_pending == s2.eval_pending, "train state differs after the round trip");
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
        snprintf(path, sizeof(path), "%s/model_%08d.bin", dir.s, 40);
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
            TrainState s = {40, 2, 32, 1, writers, r, 99, 0};
            state_path(path, sizeof(path), dir.s, 40, r);
            CHECK(!checkpoint_complete(dir.s, 40) || r == 0, "%d of %d state files make a complete checkpoint", r, writers);
            const int32_t ffn[3 * 2] = {1, 64, 100 + r, 0, 32, 200 + r}; // tails sized per rank
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
                int32_t ffn[3 * 2] = {0};
                int has_ffn = checkpoint_load_state(dir.s, 40, &c, readers, r, &s, loader2, sizeof(loader2), got_m, got_v, ffn);
                int from = readers == writers ? r : 0; // its own file, or rank 0's when re-sharded
                CHECK(has_ffn && ffn[0] == 1 && ffn[1] == 64 && ffn[2] == 100 + from && ffn[5] == 200 + from,
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
        snprintf(path, sizeof(path), "%s/model_%08d.bin", dir.s, 40);
        remove(path);
        rmdir(dir.s);
    }
    free(m);
    free(v);
}

// every parameter is owned by exactly one rank, in flat order within a rank,
// and bucket shares are what zero_share says
static void test_zero_layout(void) {
    GPTConfig c = small_config();
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
            CHECK(z.num_buckets == 2 + 7 * c.num_layers, "P=%d: %d buckets", P, z.num_buckets);
            zero_layout_free(&z);
        }
        for (size_t i = 0; i < n; i++) { bad += owner[i] != 1; }
        CHECK(bad == 0, "P=%d: %d layout errors", P, bad);
        free(owner);
    }
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

int main(void) {
    make_tmp_dir("test_checkpoint");
    test_round_trip();
    test_zero_layout();
    test_resharding();
    test_log_truncation();
    remove_tmp_dir();
    return test_summary("test_checkpoint");
}
