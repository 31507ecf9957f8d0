// the safetensors reader (llmc/safetensors.h): a file that opens has each of its F32, BF16 and F16
// tensors read
#include "fuzz/fuzz.h"
#include "llmc/safetensors.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_file("model.safetensors", data, size);
    SafeTensors st;
    safetensors_open(&st, path);
    for (int k = 0; k < st.n; k++) {
        const SafeTensor* t = &st.tensors[k];
        if (safetensors_find(&st, t->name) != t) { abort(); } // names are unique
        if (t->dtype == ST_OTHER) { continue; }
        size_t numel = (size_t)(t->end - t->begin) / (t->dtype == ST_F32 ? 4 : 2);
        float* out = (float*)malloc(numel ? numel * sizeof(float) : 1);
        safetensors_read(&st, t, out);
        free(out);
    }
    safetensors_close(&st);
}
