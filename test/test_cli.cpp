/*
 Tests for the flag parser (llmc/cli.h) and the token sampler (llmc/sampler.h).
*/
#include "llmc/cli.h"
#include "llmc/sampler.h"
#include "test/test.h"

static int batch, tokens, verbose;
static float lr;
static const char* name;

// parses a NULL-terminated array of strings, argv[0] included; returns the index of the first positional
// argument, or with strict = 1 refuses any
static int parse_with(const void* args, int strict) {
    char** argv = (char**)args;
    int argc = 0;
    while (argv[argc]) { argc++; }
    ArgSpec specs[] = {
        {'b', "batch", ARG_INT, &batch, 1, 64, "micro-batch", 0},
        {'l', "lr", ARG_FLOAT, &lr, 0, 1, "learning rate", 0},
        {0, "name", ARG_STRING, &name, 0, 0, "a name", 0},
        {0, "tokens", ARG_INT, &tokens, 0, 1e9, "tokens", 0},
        {0, "old_tokens", ARG_INT, &tokens, 0, 1e9, NULL, 0}, // an alias: not in the help
        {'v', "verbose", ARG_SWITCH, &verbose, 0, 0, "say more", 0},
    };
    int n = (int)(sizeof(specs) / sizeof(specs[0]));
    if (strict) { cli_parse(argc, argv, "usage", specs, n); return argc; }
    return cli_parse_args(argc, argv, "usage", specs, n);
}

static void parse(const void* args) { parse_with(args, 1); }

// parse, with what it prints on stdout (the help) sent to stderr, which run_child captures
static void parse_to_stderr(const void* args) {
    fflush(stdout);
    dup2(STDERR_FILENO, STDOUT_FILENO);
    parse(args);
}

static void expect_error(const char** args, const char* want) {
    char err[512];
    int rc = run_child(parse, args, err, sizeof(err));
    CHECK(rc == 1 && strstr(err, want) != NULL, "exit %d, message '%s' lacks '%s'", rc, err, want);
}

static void test_cli(void) {
    const char* ok[] = {"prog", "-b", "8", "--lr=0.5", "--name", "x", NULL};
    batch = 1; lr = 0; name = "default"; verbose = 0;
    parse(ok);
    CHECK(batch == 8 && lr == 0.5f && strcmp(name, "x") == 0 && verbose == 0, "parsed %d %g %s", batch, lr, name);
    const char* with_switch[] = {"prog", "--verbose", "-b", "2", NULL};
    parse(with_switch);
    CHECK(verbose == 1 && batch == 2, "a switch takes no value: %d %d", verbose, batch);
    const char* switch_value[] = {"prog", "--verbose=1", NULL};
    expect_error(switch_value, "--verbose takes no value");
    const char* switch_twice[] = {"prog", "-v", "--verbose", NULL};
    expect_error(switch_twice, "--verbose is given twice");
    const char* unknown[] = {"prog", "--bogus", "1", NULL};
    expect_error(unknown, "unknown flag '--bogus'");
    const char* range[] = {"prog", "-b", "65", NULL};
    expect_error(range, "-b 65 is out of range [1, 64]");
    const char* junk[] = {"prog", "--batch", "8x", NULL};
    expect_error(junk, "--batch needs an integer, got '8x'");
    const char* nan_[] = {"prog", "-l", "nan", NULL};
    expect_error(nan_, "-l needs a number");
    const char* missing[] = {"prog", "-l", NULL};
    expect_error(missing, "-l needs a value");
    const char* twice[] = {"prog", "-b", "2", "--batch", "3", NULL};
    expect_error(twice, "--batch is given twice");
    // a value after '=' is named once in the message
    const char* eq[] = {"prog", "--lr=-1", NULL};
    expect_error(eq, "error: --lr -1 is out of range [0, 1]");
    const char* eq_int[] = {"prog", "--batch=2.5", NULL};
    expect_error(eq_int, "error: --batch needs an integer, got '2.5'");
    // an integer in exponent notation, an alias, a switch, positional arguments
    const char* more[] = {"prog", "--old_tokens", "1e8", "-v", "a.txt", "-b", NULL};
    tokens = 0; verbose = 0;
    int first = parse_with(more, 0);
    CHECK(tokens == 100000000 && verbose == 1 && first == 4, "parsed %d %d, first positional %d", tokens, verbose, first);
    const char* positional[] = {"prog", "a.txt", NULL};
    expect_error(positional, "unknown flag 'a.txt'");
    // the help lists the flags but not the alias, and exits 0
    const char* help[] = {"prog", "--help", NULL};
    char out[4096];
    int rc = run_child(parse_to_stderr, help, out, sizeof(out));
    CHECK(rc == 0 && strstr(out, "--tokens") && strstr(out, "[off]") && !strstr(out, "old_tokens"),
          "--help exits %d and prints: %s", rc, out);
}

static void test_sampler(void) {
    float logits[6] = {0.5f, 3.0f, -1.0f, 2.9f, 0.0f, 100.0f}; // the last is past V = 5: never a candidate
    ProbIndex scratch[5];
    uint64_t rng = 1;
    SamplerConfig greedy = {0.0f, 0, 1.0f};
    CHECK(sample_token(logits, 5, &greedy, &rng, scratch) == 1, "greedy should pick the argmax");
    SamplerConfig top1 = {1.0f, 1, 1.0f};
    SamplerConfig top_p = {1.0f, 0, 0.01f};
    int ok = 1;
    for (int i = 0; i < 100; i++) {
        ok &= sample_token(logits, 5, &top1, &rng, scratch) == 1;
        ok &= sample_token(logits, 5, &top_p, &rng, scratch) == 1;
    }
    CHECK(ok, "top-k 1 and a tiny top-p should always pick the argmax");
    // top-k 2 keeps tokens 1 and 3 only; their frequencies follow the softmax
    SamplerConfig top2 = {1.0f, 2, 1.0f};
    int counts[5] = {0};
    int draws = 20000;
    for (int i = 0; i < draws; i++) { counts[sample_token(logits, 5, &top2, &rng, scratch)]++; }
    double p1 = 1.0 / (1.0 + exp(2.9 - 3.0));
    CHECK(counts[0] + counts[2] + counts[4] == 0, "top-k 2 sampled outside the top 2");
    CHECK(fabs((double)counts[1] / draws - p1) < 0.02, "token 1 frequency %g, expected %g", (double)counts[1] / draws, p1);
    // the same seed gives the same sequence
    uint64_t a = 9, b = 9;
    SamplerConfig full = {0.8f, 0, 0.9f};
    int same = 1;
    for (int i = 0; i < 50; i++) { same &= sample_token(logits, 5, &full, &a, scratch) == sample_token(logits, 5, &full, &b, scratch); }
    CHECK(same, "sampling is not deterministic for a seed");
}

int main(void) {
    make_tmp_dir("test_cli");
    test_cli();
    test_sampler();
    remove_tmp_dir();
    return test_summary("test_cli");
}
