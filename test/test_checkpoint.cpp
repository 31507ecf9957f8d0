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

static void load_state_other_config(const void* path) {
    GPTConfig other = small_config();
    other.hidden = 48;
    TrainState s;
    char loader[8];
    size_t n = num_parameters(&other);
    float* m = (float*)mallocCheck(n * sizeof(float));
    float* v = (float*)mallocCheck(n * sizeof(float));
    checkpoint_load_state((const char*)path, &other, &s, loader, sizeof(loader), m, v);
}

static void expect_child_error(void (*fn)(const void*), const char* path, const char* want) {
    char err[1024];
    int rc = run_child(fn, path, err, sizeof(err));
    CHECK(rc == 1, "expected exit 1, got %d (%s)", rc, err);
    CHECK(strncmp(err, "error: ", 7) == 0 && strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
    CHECK(strchr(err, '\n') == strrchr(err, '\n'), "message is not one line: %s", err);
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
    Path model = tmp_path("model.bin");
    checkpoint_save_model(model.s, &c, params, 17);
    CHECK(!file_exists(tmp_path("model.bin.tmp").s), "the temporary file was left behind");
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
    TrainState s = {17, 4, 32, 3, 1, 0, 0x1234567890abcdefull};
    char loader[24] = "loader state bytes";
    Path state = tmp_path("state.bin");
    checkpoint_save_state(state.s, &c, &s, loader, sizeof(loader), m, v);
    TrainState s2;
    char loader2[24];
    float* m2 = (float*)mallocCheck(n * sizeof(float));
    float* v2 = (float*)mallocCheck(n * sizeof(float));
    checkpoint_load_state(state.s, &c, &s2, loader2, sizeof(loader2), m2, v2);
    CHECK(memcmp(&s, &s2, sizeof(s)) == 0, "train state differs after the round trip");
    CHECK(memcmp(loader, loader2, sizeof(loader)) == 0, "loader state differs");
    CHECK(memcmp(m, m2, n * sizeof(float)) == 0 && memcmp(v, v2, n * sizeof(float)) == 0, "moments differ");

    // the errors
    expect_child_error(load_state_other_config, state.s, "is for another model: hidden 40 (checkpoint) vs 48 (this run)");
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
    test_log_truncation();
    remove_tmp_dir();
    return test_summary("test_checkpoint");
}
