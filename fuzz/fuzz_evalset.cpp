// the multiple-choice eval file reader (llmc/evalset.h) on any file: a file it accepts is whole
#include "fuzz/fuzz.h"
#include "llmc/evalset.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_file("eval.bin", data, size);
    EvalSet s;
    evalset_load(&s, path);
    for (int i = 0; i < s.num_examples; i++) {
        if (s.labels[i] < 0 || s.labels[i] >= s.num_endings) { abort(); }
        for (int j = 0; j <= s.num_endings; j++) {
            size_t n;
            const int* list = evalset_list(&s, i, j, &n);
            if (n == 0) { abort(); }
            for (size_t t = 0; t < n; t++) {
                if (list[t] < 0 || list[t] >= s.vocab_size) { abort(); }
            }
        }
    }
    evalset_free(&s);
}
