// the checkpoint loader (llmc/checkpoint.h): a model file, or (by its magic) the state file of
// step 0 of a directory that also holds a model of fuzz_small_config()
#include "fuzz/fuzz.h"
#include "fuzz/common.h"
#include "llmc/checkpoint.h"
#include "llmc/dataloader.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    static char dir[256];
    GPTConfig c = fuzz_small_config();
    size_t n = num_parameters(&c);
    if (dir[0] == '\0') { // the directory's model file, written once (untracked: before any input)
        int armed = fuzz_armed;
        fuzz_armed = 0;
        snprintf(dir, sizeof(dir), "%s", fuzz_path("ckpt"));
        make_dir(dir);
        float* params = (float*)calloc(n, sizeof(float));
        char path[512];
        snprintf(path, sizeof(path), "%s/model_00000000.bin", dir);
        checkpoint_save_model(path, &c, params, 0);
        free(params);
        fuzz_armed = armed;
    }
    int32_t magic = 0;
    if (size >= 4) { memcpy(&magic, data, 4); }
    if (magic != CKPT_STATE_MAGIC) {
        const char* path = fuzz_write_file("model.bin", data, size);
        GPTConfig got;
        int step;
        float* params = checkpoint_load_model(path, &got, &step);
        for (size_t i = 0, m = num_parameters(&got); i < m; i++) {
            if (!isfinite(params[i])) { abort(); }
        }
        free(params);
        return;
    }
    char path[512];
    state_path(path, sizeof(path), dir, 0, 0);
    FILE* fp = fopen(path, "wb");
    if (fp == NULL || fwrite(data, 1, size, fp) != size || fclose(fp) != 0) { abort(); }
    checkpoint_complete(dir, 0);
    TrainState s;
    DataLoaderState loader;
    float* m = (float*)malloc(n * sizeof(float));
    float* v = (float*)malloc(n * sizeof(float));
    int32_t* ffn = (int32_t*)malloc(ffn_state_ints(c.num_layers) * sizeof(int32_t));
    checkpoint_load_state(dir, 0, &c, 1, 0, &s, &loader, sizeof(loader), m, v, ffn);
    free(ffn);
    free(m);
    free(v);
}
