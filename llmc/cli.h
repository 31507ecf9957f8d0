/*
 Command-line flags, llm.c style: every flag has a short form (-b 8), a long
 form (--batch 8 or --batch=8), a type, a range and a help line; a switch
 (ARG_SWITCH, --serve) takes no value and turns its int to 1. Anything else
 is a one-line error: an unknown flag, a missing value, a value that does not
 parse completely or lies outside its range. -h/--help prints the table.
 A switch (ARG_SWITCH) takes no value; a flag without a help line is an alias
 that the table leaves out (an older spelling); with cli_parse_args the first
 argument that is not a flag starts the positional ones (input files).
*/
#ifndef LLMC_CLI_H
#define LLMC_CLI_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/utils.h"

typedef enum { ARG_INT, ARG_FLOAT, ARG_STRING, ARG_SWITCH } ArgType; // a switch: an int set to 1, no value

typedef struct {
    char short_name;        // 0 when the flag has only a long name
    const char* long_name;
    ArgType type;
    void* dest;             // int* (ARG_INT, ARG_SWITCH), float* or const char**, holding the default
    double min, max;        // allowed range of numeric values
    const char* help;       // NULL: an alias, not listed
    int given;              // set by cli_parse when the flag appears
} ArgSpec;

static inline void cli_print_help(const char* usage, ArgSpec* specs, int n) {
    printf("%s\n\nflags (default in brackets):\n", usage);
    for (int i = 0; i < n; i++) {
        char names[64], def[64];
        if (specs[i].help == NULL) { continue; }
        if (specs[i].short_name) {
            snprintf(names, sizeof(names), "-%c, --%s", specs[i].short_name, specs[i].long_name);
        } else {
            snprintf(names, sizeof(names), "    --%s", specs[i].long_name);
        }
        if (specs[i].type == ARG_INT) { snprintf(def, sizeof(def), "%d", *(int*)specs[i].dest); }
        else if (specs[i].type == ARG_SWITCH) { snprintf(def, sizeof(def), "off"); } // (a switch only turns on)
        else if (specs[i].type == ARG_FLOAT) { snprintf(def, sizeof(def), "%g", *(float*)specs[i].dest); }
        else {
            const char* value = *(const char**)specs[i].dest;
            snprintf(def, sizeof(def), "%s", value ? value : "none");
        }
        printf("  %-24s %s [%s]\n", names, specs[i].help, def);
    }
}

static inline void cli_set(ArgSpec* spec, const char* flag, const char* value) {
    char* end = NULL;
    errno = 0;
    if (spec->type == ARG_STRING) {
        *(const char**)spec->dest = value;
    } else if (spec->type == ARG_INT) {
        // also a whole number in exponent notation (1e8)
        double v = strtod(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !isfinite(v) || v != floor(v)) {
            fatal("%s needs an integer, got '%s'", flag, value);
        }
        if (v < spec->min || v > spec->max) { fatal("%s %.0f is out of range [%.0f, %.0f]", flag, v, spec->min, spec->max); }
        *(int*)spec->dest = (int)v;
    } else {
        double v = strtod(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !isfinite(v)) { fatal("%s needs a number, got '%s'", flag, value); }
        if (v < spec->min || v > spec->max) { fatal("%s %g is out of range [%g, %g]", flag, v, spec->min, spec->max); }
        *(float*)spec->dest = (float)v;
    }
    spec->given = 1;
}

// parses the flags up to the first argument that is not one; returns its index (argc if none)
static inline int cli_parse_args(int argc, char** argv, const char* usage, ArgSpec* specs, int n) {
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            cli_print_help(usage, specs, n);
            exit(EXIT_SUCCESS);
        }
        if (arg[0] != '-' || arg[1] == '\0') { return i; } // (a lone '-' is standard input)
        ArgSpec* spec = NULL;
        const char* value = NULL;
        char flag[256]; // the flag as given, without its =value, for messages
        snprintf(flag, sizeof(flag), "%s", arg);
        if (arg[1] == '-') {
            const char* name = arg + 2;
            const char* eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            for (int j = 0; j < n; j++) {
                if (strlen(specs[j].long_name) == len && strncmp(specs[j].long_name, name, len) == 0) { spec = &specs[j]; }
            }
            if (eq) {
                value = eq + 1;
                if ((size_t)(eq - arg) < sizeof(flag)) { flag[eq - arg] = '\0'; }
            }
        } else if (arg[2] == '\0') {
            for (int j = 0; j < n; j++) {
                if (specs[j].short_name == arg[1]) { spec = &specs[j]; }
            }
        }
        if (spec == NULL) { fatal("unknown flag '%s' (see --help)", flag); }
        if (spec->given) { fatal("%s is given twice", flag); }
        if (spec->type == ARG_SWITCH) {
            if (value != NULL) { fatal("%s takes no value", flag); }
            *(int*)spec->dest = 1;
            spec->given = 1;
            continue;
        }
        if (value == NULL) {
            if (i + 1 >= argc) { fatal("%s needs a value", flag); }
            value = argv[++i];
        }
        cli_set(spec, flag, value);
    }
    return argc;
}

// parses every argument as a flag
static inline void cli_parse(int argc, char** argv, const char* usage, ArgSpec* specs, int n) {
    int first = cli_parse_args(argc, argv, usage, specs, n);
    if (first < argc) { fatal("unknown flag '%s' (see --help)", argv[first]); }
}

static inline int cli_given(const ArgSpec* specs, int n, const char* long_name) {
    for (int i = 0; i < n; i++) {
        if (strcmp(specs[i].long_name, long_name) == 0) { return specs[i].given; }
    }
    return 0;
}

#endif // LLMC_CLI_H
