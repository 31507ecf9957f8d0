// the flag parser (llmc/cli.h): the input is the arguments, separated by NUL bytes
#include "fuzz/fuzz.h"
#include "llmc/cli.h"

static void fuzz_one(const uint8_t* data, size_t size) {
    char* args = (char*)malloc(size + 1);
    memcpy(args, data, size);
    args[size] = '\0';
    char* argv[64];
    int argc = 0;
    argv[argc++] = (char*)"prog";
    for (char* p = args; argc < 64 && p <= args + size; p += strlen(p) + 1) { argv[argc++] = p; }
    int batch = 8, steps = 100, serve = 0;
    float lr = 3e-4f, eps = 1e-5f;
    const char* out = "out";
    const char* none = NULL;
    ArgSpec specs[] = {
        {'b', "batch", ARG_INT, &batch, 1, 1 << 16, "micro-batch size", 0},
        {'x', "max-steps", ARG_INT, &steps, -1, 1 << 30, "steps", 0},
        {'l', "lr", ARG_FLOAT, &lr, 0, 10, "learning rate", 0},
        {0, "norm-eps", ARG_FLOAT, &eps, 1e-12, 1, "epsilon", 0},
        {'o', "output", ARG_STRING, &out, 0, 0, "output directory", 0},
        {0, "tokenizer", ARG_STRING, &none, 0, 0, "tokenizer file", 0},
        {'S', "serve", ARG_SWITCH, &serve, 0, 0, "a switch", 0},
    };
    int n = (int)(sizeof(specs) / sizeof(specs[0]));
    cli_parse(argc, argv, "usage: prog [flags]", specs, n);
    if (batch < 1 || batch > (1 << 16) || steps < -1 || !(lr >= 0 && lr <= 10) || !(eps >= 1e-12f && eps <= 1) ||
        (serve != 0 && serve != 1)) {
        abort();
    }
    cli_given(specs, n, "lr");
    free(args);
}
