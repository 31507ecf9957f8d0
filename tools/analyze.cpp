/*
 analyze: the sparsity analysis of a train_gpt_sparse checkpoint on shards of
 text (a val shard, say), on the CPU reference path: how many FFN units fire
 per token in each layer, at each position of the sequence and for each token
 id (the most and the least active tokens), and how unevenly the units fire;
 printed as tables and, with -o, written as JSON. llmc/analyze.h says what
 each figure is.

   ./analyze -m MODEL "data/corpus_val_*.bin" [--batches N] [-b B] [-t T] [-o analysis.json]

 The pattern is a glob, quoted so that the shell leaves it to the loader.
 infer --analyze PATTERN runs the same code, with the flags named
 --analyze-NAME, and prints the same bytes.
*/
#include "llmc/analyze.h"

// The shard pattern: the one argument that is neither a flag nor a flag's value (every flag but
// -h takes one, after it or after '='). The rest stays in argv, in order, for cli_parse.
static const char* take_pattern(int* argc, char** argv) {
    const char* pattern = NULL;
    int kept = 1;
    for (int i = 1; i < *argc; i++) {
        const char* a = argv[i];
        if (a[0] == '-' && a[1] != '\0') {
            argv[kept++] = argv[i];
            int help = strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0;
            int inline_value = a[1] == '-' && strchr(a, '=') != NULL;
            if (!help && !inline_value && i + 1 < *argc) { argv[kept++] = argv[++i]; }
        } else if (pattern != NULL) {
            fatal("one shard pattern, got '%s' and '%s' (quote a glob so that the shell does not expand it)", pattern, a);
        } else {
            pattern = a;
        }
    }
    *argc = kept;
    return pattern;
}

int main(int argc, char** argv) {
    AnalyzeOptions o;
    analyze_defaults(&o, "");
    char model_file[4096];
    ArgSpec specs[] = {
        {'m', "model", ARG_STRING, &o.model_path, 0, 0, "train_gpt_sparse checkpoint, or a directory: its newest (default: out)", 0},
        {0, "tokenizer", ARG_STRING, &o.tokenizer_path, 0, 0, "tiktoken rank file or Hugging Face tokenizer.json", 0},
        {'q', "quiet", ARG_INT, &o.quiet, 0, 1, "1 = no \"model:\" line on stderr", 0},
        ANALYZE_FLAGS(&o, "", 1),
    };
    const char* pattern = take_pattern(&argc, argv);
    cli_parse(argc, argv, "usage: ./analyze [flags] PATTERN\n"
              "Measures the sparsity of a checkpoint's FFN activations on the shards PATTERN (a quoted glob) on the CPU.",
              specs, (int)(sizeof(specs) / sizeof(specs[0])));
    if (pattern == NULL) { fatal("no shards given: ./analyze [flags] PATTERN, e.g. \"data/corpus_val_*.bin\""); }
    o.pattern = pattern;
    o.model_path = checkpoint_model_arg(o.model_path ? o.model_path : "out", o.model_path != NULL, model_file,
                                        sizeof(model_file));
    analyze_checkpoint(&o);
    return 0;
}
