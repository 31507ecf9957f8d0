/*
 Checkpoint files. Both start with a header of 256 little-endian int32 that
 holds the magic, the version and the whole model config, checked on load.

 model file (what infer loads, and the first half of a resume):
   [0] magic 20261122, [1] version 2, [2..11] config, [12] step,
   [13..14] number of parameters (lo, hi); then the fp32 parameters in the
   flat layout of llmc/model.h.
 state file (the optimizer and data position of one process, for --resume):
   [0] magic 20261123, [1] version 2, [2..11] config, [12] step,
   [13..14] number of parameters, [15] micro-batch B, [16] sequence length T,
   [17] gradient accumulation steps, [18] number of processes P, [19] rank,
   [20..21] sampling RNG, [22] bytes of the data loader state, [23] number of
   int32 of FFN state (3 per layer: sparse or dense, ELL width, tail rows; 0
   when none was saved), [24] 1 when the validation and text sample due at this
   step have not run yet (a run stopped by a signal), else 0, [27..30] the
   learning-rate schedule that trained it: its last step, warmup steps, peak
   lr (fp32 bits) and final lr fraction (fp32 bits), all 0 in the files written
   before these fields (added without a new version: such a file says nothing
   of its schedule);
   then the loader state, then AdamW m and v (fp32) of the parameters the rank
   owns, in the packed order of llmc/zero.h (with P = 1: all of them, flat),
   then the FFN state.
 In both, [25] is the FFN activation (0 ReLU, 1 SiLU) and [26] 1 when the
 output head is untied (a tensor lm_head after final_norm), 0 when it is the
 embedding: config fields too, added after version 2 without a new version,
 because the files before them hold 0 there, which says ReLU and tied, what
 those files are (a build that predates the fields refuses a file with a 1
 there as a corrupt header).
 In both, the ints up to [253] not named are 0, and [254..255] (lo, hi) are
 the XXH64 (llmc/xxhash.h) of the whole file with these two ints read as 0.
 Version 1 files are the same without the checksum ([254..255] are 0): they
 still load, with a one-line note that nothing verified them.

 Loading checks every header field against its bounds (llmc/model.h's for the
 config) before any size is computed from it, the file size against the one
 the header implies, then the checksum (checkpoint_verify), all before anything
 the header sizes is allocated; parameters or moments that are not all finite
 are refused on load, and never written. Each problem is a one-line error
 naming the file.

 A checkpoint of step s in a directory is model_s.bin and state_s_r.bin for
 r < P; it is complete when all P + 1 files exist. Files are written to
 "<path>.tmp" and renamed into place, so a file that exists is whole.
*/
#ifndef LLMC_CHECKPOINT_H
#define LLMC_CHECKPOINT_H

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include "llmc/model.h"
#include "llmc/utils.h"
#include "llmc/xxhash.h"
#include "llmc/zero.h"

#define CKPT_MODEL_MAGIC 20261122
#define CKPT_STATE_MAGIC 20261123
#define CKPT_VERSION 2
#define CKPT_HEADER_INTS 256
#define CKPT_HEADER_BYTES 1024
#define CKPT_CHECKSUM 254            // the checksum's two ints
#define CKPT_ACTIVATION 25           // the config fields after the state file's run fields
#define CKPT_UNTIED_HEAD 26
#define CKPT_STATE_INTS 31           // the state header's ints that hold fields
// the bounds of the state header's run fields (the trainer's flags allow the same)
#define CKPT_MAX_BATCH (1 << 16)
#define CKPT_MAX_PROCESSES (1 << 20)
#define CKPT_MAX_TOKENS_PER_STEP (1 << 30)

typedef struct {
    int step;
    int B, T, grad_accum, num_processes, rank;
    uint64_t sample_rng;
    int eval_pending; // the validation and sample of this step are still to do
    // the learning-rate schedule that trained it (llmc/adamw.h's lr_at_step); sched_steps 0: not recorded
    int sched_steps, sched_warmup;
    float sched_lr, sched_final_frac;
    int unverified;   // on load: a file read was version 1, without a checksum (the caller notes it)
} TrainState;

static inline uint32_t float_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline void header_put_config(int32_t* h, const GPTConfig* c) {
    h[2] = c->vocab_size; h[3] = c->padded_vocab_size; h[4] = c->num_layers; h[5] = c->channels;
    h[6] = c->num_heads; h[7] = c->num_kv_heads; h[8] = c->hidden; h[9] = c->max_seq_len;
    h[10] = (int32_t)float_bits(c->rope_theta); h[11] = (int32_t)float_bits(c->norm_eps);
    h[CKPT_ACTIVATION] = c->activation; h[CKPT_UNTIED_HEAD] = c->untied_head;
}

static inline GPTConfig header_get_config(const int32_t* h) {
    GPTConfig c;
    c.vocab_size = h[2]; c.padded_vocab_size = h[3]; c.num_layers = h[4]; c.channels = h[5];
    c.num_heads = h[6]; c.num_kv_heads = h[7]; c.hidden = h[8]; c.max_seq_len = h[9];
    c.rope_theta = bits_float((uint32_t)h[10]); c.norm_eps = bits_float((uint32_t)h[11]);
    c.activation = h[CKPT_ACTIVATION]; c.untied_head = h[CKPT_UNTIED_HEAD];
    return c;
}

// writes "<field> <a> (checkpoint) vs <b> (this run)" for the first differing field; 0 if none
static inline int config_mismatch(const GPTConfig* ckpt, const GPTConfig* run, char* msg, size_t len) {
    const struct { const char* name; double a, b; } fields[] = {
        {"vocab_size", (double)ckpt->vocab_size, (double)run->vocab_size},
        {"num_layers", (double)ckpt->num_layers, (double)run->num_layers},
        {"channels", (double)ckpt->channels, (double)run->channels},
        {"num_heads", (double)ckpt->num_heads, (double)run->num_heads},
        {"num_kv_heads", (double)ckpt->num_kv_heads, (double)run->num_kv_heads},
        {"hidden", (double)ckpt->hidden, (double)run->hidden},
        {"max_seq_len", (double)ckpt->max_seq_len, (double)run->max_seq_len},
        {"rope_theta", (double)ckpt->rope_theta, (double)run->rope_theta},
        {"norm_eps", (double)ckpt->norm_eps, (double)run->norm_eps},
        {"activation (0 relu, 1 silu)", (double)ckpt->activation, (double)run->activation},
        {"untied_head", (double)ckpt->untied_head, (double)run->untied_head},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].a != fields[i].b) {
            snprintf(msg, len, "%s %g (checkpoint) vs %g (this run)", fields[i].name, fields[i].a, fields[i].b);
            return 1;
        }
    }
    return 0;
}

// the checksum of a header (its own two ints read as 0), to be continued over the payload
static inline void checkpoint_hash_header(Xxh64* x, const int32_t h[CKPT_HEADER_INTS]) {
    int32_t copy[CKPT_HEADER_INTS];
    memcpy(copy, h, sizeof(copy));
    copy[CKPT_CHECKSUM] = copy[CKPT_CHECKSUM + 1] = 0;
    xxh64_init(x);
    xxh64_update(x, copy, sizeof(copy));
}

static inline void checkpoint_put_checksum(int32_t* h, const Xxh64* x) {
    uint64_t sum = xxh64_digest(x);
    h[CKPT_CHECKSUM] = (int32_t)(uint32_t)(sum & 0xffffffffu);
    h[CKPT_CHECKSUM + 1] = (int32_t)(uint32_t)(sum >> 32);
}

static inline uint64_t checkpoint_get_checksum(const int32_t* h) {
    return (uint64_t)(uint32_t)h[CKPT_CHECKSUM] | ((uint64_t)(uint32_t)h[CKPT_CHECKSUM + 1] << 32);
}

// the first non-finite value of x[0..n), named as element k of the model's tensors; 0 if none
static inline int checkpoint_find_nonfinite(const float* x, size_t n, const GPTConfig* c, char* msg, size_t len) {
    for (size_t i = 0; i < n; i++) {
        if (isfinite(x[i])) { continue; }
        size_t offsets[NUM_PARAM_TENSORS];
        param_offsets(offsets, c);
        int t = NUM_PARAM_TENSORS - 1;
        while (offsets[t] > i) { t--; }
        snprintf(msg, len, "%s[%zu] is %s", param_names[t], i - offsets[t], isnan(x[i]) ? "NaN" : "infinite");
        return 1;
    }
    return 0;
}

static inline void checkpoint_save_model(const char* path, const GPTConfig* c, const float* params, int step) {
    int32_t h[CKPT_HEADER_INTS] = {0};
    size_t n = num_parameters(c);
    h[0] = CKPT_MODEL_MAGIC; h[1] = CKPT_VERSION;
    header_put_config(h, c);
    h[12] = step;
    h[13] = (int32_t)(uint32_t)(n & 0xffffffffu); h[14] = (int32_t)(uint32_t)(n >> 32);
    char msg[128];
    if (checkpoint_find_nonfinite(params, n, c, msg, sizeof(msg))) { fatal("refusing to write %s: %s", path, msg); }
    Xxh64 x;
    checkpoint_hash_header(&x, h);
    xxh64_update(&x, params, n * sizeof(float));
    checkpoint_put_checksum(h, &x);
    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(h, sizeof(int32_t), CKPT_HEADER_INTS, fp);
    fwriteCheck(params, sizeof(float), n, fp);
    atomic_commit(fp, tmp, path);
}

// reads and checks the header of either file: magic, version, the config and every field's
// bounds; returns the open file positioned after it, its size in *size
static inline FILE* checkpoint_open(const char* path, int32_t magic, int32_t h[CKPT_HEADER_INTS], long* size) {
    FILE* fp = fopenCheck(path, "rb");
    *size = file_size(fp); // (a directory is an error here)
    const char* kind = magic == CKPT_MODEL_MAGIC ? "model" : "optimizer state";
    if (*size < CKPT_HEADER_BYTES) {
        fatal("%s: %ld bytes is too short for a checkpoint (a %d-byte header, then the data)", path, *size,
              CKPT_HEADER_BYTES);
    }
    freadCheck(h, sizeof(int32_t), CKPT_HEADER_INTS, fp);
    if (h[0] != magic) { fatal("%s: bad magic %d (expected %d for a %s file)", path, h[0], magic, kind); }
    if (h[1] != 1 && h[1] != CKPT_VERSION) {
        fatal("%s: version %d, this build reads versions 1 and %d", path, h[1], CKPT_VERSION);
    }
    GPTConfig c = header_get_config(h);
    config_validate_from(&c, path);
    if (h[12] < 0) { fatal("%s: step %d must be >= 0", path, h[12]); }
    size_t n = (size_t)(uint32_t)h[13] | ((size_t)(uint32_t)h[14] << 32);
    if (n != num_parameters(&c)) { fatal("%s: header says %zu parameters, its config has %zu", path, n, num_parameters(&c)); }
    int named = magic == CKPT_MODEL_MAGIC ? 15 : CKPT_STATE_INTS; // the ints that hold fields
    for (int i = named; i < CKPT_CHECKSUM; i++) {
        if (h[i] != 0 && i != CKPT_ACTIVATION && i != CKPT_UNTIED_HEAD) { fatal("%s: header int %d is %d, expected 0 (a corrupt or foreign %s file)", path, i, h[i], kind); }
    }
    if (h[1] == 1 && checkpoint_get_checksum(h) != 0) {
        fatal("%s: a version 1 checkpoint with a checksum, expected none (corrupt?)", path);
    }
    return fp;
}

// one-line note for a version 1 file, which has no checksum (printed once the file has passed every
// other check, so that an error stays the only line)
static inline void checkpoint_note_unverified(const char* path) {
    fprintf(stderr, "note: %s is a version 1 checkpoint: it has no checksum, loaded unverified\n", path);
}

// The check of a checkpoint's contents against its header, which every loader makes before it
// allocates anything the header sizes: the file's size must be the header's plus the payload the
// header implies, then the XXH64 of the whole file, read in chunks, must be the header's (a version 1
// file has none). fp is after the header, and is left there.
static inline void checkpoint_verify(FILE* fp, const char* path, const int32_t* h, long size, uint64_t payload) {
    if ((uint64_t)size != CKPT_HEADER_BYTES + payload) {
        fatal("%s: file is %ld bytes, its header describes %llu (%s)", path, size,
              (unsigned long long)(CKPT_HEADER_BYTES + payload), (uint64_t)size < CKPT_HEADER_BYTES + payload
              ? "truncated?" : "trailing bytes?");
    }
    if (h[1] == 1) { return; }
    Xxh64 x;
    checkpoint_hash_header(&x, h);
    const size_t chunk = (size_t)1 << 22;
    unsigned char* buf = (unsigned char*)mallocCheck(chunk);
    for (size_t got; (got = fread(buf, 1, chunk, fp)) > 0;) { xxh64_update(&x, buf, got); }
    if (ferror(fp)) { fatal("cannot read %s: %s", path, strerror(errno)); }
    free(buf);
    uint64_t want = checkpoint_get_checksum(h), got = xxh64_digest(&x);
    if (got != want) {
        fatal("%s: checksum mismatch (header %016llx, contents %016llx): the file is corrupt", path,
              (unsigned long long)want, (unsigned long long)got);
    }
    fseekCheck(fp, CKPT_HEADER_BYTES, SEEK_SET);
}

// checkpoint_open of a model file, then checkpoint_verify of its parameters
static inline FILE* checkpoint_open_model(const char* path, int32_t h[CKPT_HEADER_INTS]) {
    long size;
    FILE* fp = checkpoint_open(path, CKPT_MODEL_MAGIC, h, &size);
    GPTConfig c = header_get_config(h);
    checkpoint_verify(fp, path, h, size, (uint64_t)num_parameters(&c) * sizeof(float));
    return fp;
}

// the config and step of a model file whose size and checksum hold, without reading its parameters
// into memory (what a run builds its model from before it loads the weights)
static inline GPTConfig checkpoint_read_config(const char* path, int* step) {
    int32_t h[CKPT_HEADER_INTS];
    fcloseCheck(checkpoint_open_model(path, h));
    if (step) { *step = h[12]; }
    return header_get_config(h);
}

// loads a model file: fills the config and returns malloc'd fp32 parameters
static inline float* checkpoint_load_model(const char* path, GPTConfig* config, int* step) {
    int32_t h[CKPT_HEADER_INTS];
    FILE* fp = checkpoint_open_model(path, h);
    *config = header_get_config(h);
    if (step) { *step = h[12]; }
    size_t n = num_parameters(config);
    float* params = (float*)mallocCheck(n * sizeof(float));
    freadCheck(params, sizeof(float), n, fp);
    fcloseCheck(fp);
    char msg[128];
    if (checkpoint_find_nonfinite(params, n, config, msg, sizeof(msg))) {
        fatal("%s: %s: a checkpoint's parameters must all be finite", path, msg);
    }
    if (h[1] == 1) { checkpoint_note_unverified(path); }
    return params;
}

// the index of the first of the `owned` moments m, v that is not finite; owned if none
static inline size_t checkpoint_find_nonfinite_moment(const float* m, const float* v, size_t owned) {
    size_t i = 0;
    while (i < owned && isfinite(m[i]) && isfinite(v[i])) { i++; }
    return i;
}

// m and v: the `owned` moments of rank s->rank of s->num_processes (llmc/zero.h);
// ffn: ffn_state_ints(L) ints (ffn_state_get, llmc/ffn/ffn.h), or NULL
static inline void checkpoint_save_state(const char* path, const GPTConfig* c, const TrainState* s,
                                         const void* loader_state, size_t loader_bytes, const float* m, const float* v,
                                         size_t owned, const int32_t* ffn) {
    int32_t h[CKPT_HEADER_INTS] = {0};
    size_t n = num_parameters(c);
    h[0] = CKPT_STATE_MAGIC; h[1] = CKPT_VERSION;
    header_put_config(h, c);
    h[12] = s->step;
    h[13] = (int32_t)(uint32_t)(n & 0xffffffffu); h[14] = (int32_t)(uint32_t)(n >> 32);
    h[15] = s->B; h[16] = s->T; h[17] = s->grad_accum; h[18] = s->num_processes; h[19] = s->rank;
    h[20] = (int32_t)(uint32_t)(s->sample_rng & 0xffffffffu); h[21] = (int32_t)(uint32_t)(s->sample_rng >> 32);
    h[22] = (int32_t)loader_bytes;
    h[23] = ffn ? ffn_state_ints(c->num_layers) : 0;
    h[24] = s->eval_pending;
    h[27] = s->sched_steps; h[28] = s->sched_warmup;
    h[29] = (int32_t)float_bits(s->sched_lr); h[30] = (int32_t)float_bits(s->sched_final_frac);
    size_t bad = checkpoint_find_nonfinite_moment(m, v, owned);
    if (bad < owned) { fatal("refusing to write %s: optimizer moment %zu is not finite (m %g, v %g)", path, bad, m[bad], v[bad]); }
    Xxh64 x;
    checkpoint_hash_header(&x, h);
    xxh64_update(&x, loader_state, loader_bytes);
    xxh64_update(&x, m, owned * sizeof(float));
    xxh64_update(&x, v, owned * sizeof(float));
    if (ffn) { xxh64_update(&x, ffn, (size_t)h[23] * sizeof(int32_t)); }
    checkpoint_put_checksum(h, &x);
    char tmp[4096];
    FILE* fp = atomic_open(path, tmp, sizeof(tmp));
    fwriteCheck(h, sizeof(int32_t), CKPT_HEADER_INTS, fp);
    fwriteCheck(loader_state, 1, loader_bytes, fp);
    fwriteCheck(m, sizeof(float), owned, fp);
    fwriteCheck(v, sizeof(float), owned, fp);
    if (ffn) { fwriteCheck(ffn, sizeof(int32_t), (size_t)h[23], fp); }
    atomic_commit(fp, tmp, path);
}

// the files of the checkpoint of `step` in dir (see the top of the file)
static inline void model_path(char* out, size_t len, const char* dir, int step) {
    snprintf(out, len, "%s/model_%08d.bin", dir, step);
}

static inline void state_path(char* out, size_t len, const char* dir, int step, int rank) {
    snprintf(out, len, "%s/state_%08d_%05d.bin", dir, step, rank);
}

// opens a state file written for the same config, checks its header, size and checksum, and
// reads its header into s (else an error naming the field); returns the rank's count of moments
// and of FFN state ints
static inline FILE* checkpoint_open_state(const char* path, const GPTConfig* run, TrainState* s, size_t loader_bytes,
                                          size_t* owned, int* ffn_ints) {
    int32_t h[CKPT_HEADER_INTS];
    long size;
    FILE* fp = checkpoint_open(path, CKPT_STATE_MAGIC, h, &size);
    GPTConfig c = header_get_config(h);
    char msg[256];
    if (config_mismatch(&c, run, msg, sizeof(msg))) { fatal("%s is for another model: %s", path, msg); }
    s->step = h[12]; s->B = h[15]; s->T = h[16]; s->grad_accum = h[17]; s->num_processes = h[18]; s->rank = h[19];
    s->sample_rng = (uint64_t)(uint32_t)h[20] | ((uint64_t)(uint32_t)h[21] << 32);
    s->eval_pending = h[24];
    if (h[24] != 0 && h[24] != 1) { fatal("%s: eval-pending flag %d is corrupt (expected 0 or 1)", path, h[24]); }
    s->sched_steps = h[27]; s->sched_warmup = h[28];
    s->sched_lr = bits_float((uint32_t)h[29]); s->sched_final_frac = bits_float((uint32_t)h[30]);
    if (s->sched_steps < 0 || s->sched_warmup < 0 || !(s->sched_lr >= 0 && s->sched_lr <= 10) ||
        !(s->sched_final_frac >= 0 && s->sched_final_frac <= 1)) {
        fatal("%s: lr schedule (%d steps, warmup %d, lr %g, final fraction %g) is corrupt", path, s->sched_steps,
              s->sched_warmup, s->sched_lr, s->sched_final_frac);
    }
    if (s->num_processes < 1 || s->num_processes > CKPT_MAX_PROCESSES || s->rank < 0 || s->rank >= s->num_processes) {
        fatal("%s: rank %d of %d processes, expected 0 <= rank < processes <= %d", path, s->rank, s->num_processes,
              CKPT_MAX_PROCESSES);
    }
    if (s->B < 1 || s->B > CKPT_MAX_BATCH || s->T < 1 || s->T > GPT_MAX_SEQ_LEN || s->grad_accum < 1 ||
        (double)s->B * s->T * s->grad_accum * s->num_processes > CKPT_MAX_TOKENS_PER_STEP) {
        fatal("%s: batch %d x seq-len %d x %d accumulation x %d processes, expected each >= 1 and at most %d tokens "
              "per step", path, s->B, s->T, s->grad_accum, s->num_processes, CKPT_MAX_TOKENS_PER_STEP);
    }
    if ((size_t)h[22] != loader_bytes) {
        fatal("%s: %d bytes of data loader state, this build's is %zu bytes (from another version?)", path, h[22],
              loader_bytes);
    }
    // (fewer ints per layer: an older file, llmc/model.h)
    if (h[23] != 0 && !ffn_state_ints_known(h[23], run->num_layers)) {
        fatal("%s: %d ints of FFN state, expected 0, %d, %d, %d, %d, %d or %d", path, h[23],
              ffn_state_ints(run->num_layers), 11 * run->num_layers + 6, 9 * run->num_layers + 6,
              9 * run->num_layers + 5, 4 * run->num_layers + 4, 3 * run->num_layers);
    }
    ZeroLayout z;
    zero_layout_init(&z, run, s->num_processes, s->rank);
    *owned = z.owned;
    zero_layout_free(&z);
    *ffn_ints = h[23];
    s->unverified = h[1] == 1;
    checkpoint_verify(fp, path, h, size, loader_bytes + 2 * (uint64_t)*owned * sizeof(float) + 4 * (uint64_t)h[23]);
    return fp;
}

// reads the m and v of an open state file (after its loader state); both must be finite
static inline void checkpoint_read_moments(FILE* fp, const char* path, float* m, float* v, size_t owned) {
    freadCheck(m, sizeof(float), owned, fp);
    freadCheck(v, sizeof(float), owned, fp);
    size_t i = checkpoint_find_nonfinite_moment(m, v, owned);
    if (i < owned) {
        fatal("%s: optimizer moment %zu (of the %zu this file holds) is not finite: m %g, v %g", path, i, owned, m[i], v[i]);
    }
}

// the optimizer state of step `step` in dir for rank `rank` of P processes,
// from the files of whatever number of processes wrote it (re-sharded when
// that differs); m and v get layout(P, rank).owned values. s: the state as
// rank 0 wrote it (its num_processes is the writers' count; unverified when
// any file read was version 1). ffn (room for ffn_state_ints(L) ints) gets the
// FFN state: this rank's own with the same number of processes, else rank 0's;
// returns how many ints it held (0: none).
static inline int checkpoint_load_state(const char* dir, int step, const GPTConfig* run, int P, int rank, TrainState* s,
                                        void* loader_state, size_t loader_bytes, float* m, float* v, int32_t* ffn) {
    char path[4096];
    size_t owned;
    int ffn_ints;
    state_path(path, sizeof(path), dir, step, 0);
    FILE* fp = checkpoint_open_state(path, run, s, loader_bytes, &owned, &ffn_ints);
    freadCheck(loader_state, 1, loader_bytes, fp);
    int writers = s->num_processes;
    if (writers == P) { // the file of this rank holds exactly its moments
        if (rank != 0) {
            fcloseCheck(fp);
            state_path(path, sizeof(path), dir, step, rank);
            TrainState mine;
            int my_ffn_ints;
            fp = checkpoint_open_state(path, run, &mine, loader_bytes, &owned, &my_ffn_ints);
            if (mine.step != s->step || mine.num_processes != writers || mine.rank != rank || my_ffn_ints != ffn_ints) {
                fatal("%s: step %d, rank %d of %d does not belong with step %d of %d processes", path, mine.step,
                      mine.rank, mine.num_processes, s->step, writers);
            }
            s->unverified |= mine.unverified;
            fseekCheck(fp, (long)loader_bytes, SEEK_CUR);
        }
        checkpoint_read_moments(fp, path, m, v, owned);
        // the ranks choose each layer's path alike, but each sized its tail for its own tokens
        if (ffn_ints) { freadCheck(ffn, sizeof(int32_t), (size_t)ffn_ints, fp); }
        fcloseCheck(fp);
        return ffn_ints;
    }
    if (ffn_ints) { // rank 0's
        fseekCheck(fp, 2 * (long)(owned * sizeof(float)), SEEK_CUR);
        freadCheck(ffn, sizeof(int32_t), (size_t)ffn_ints, fp);
    }
    // re-shard: every writer's moments into full arrays, then this rank's share
    fcloseCheck(fp);
    size_t n = num_parameters(run);
    float* full_m = (float*)mallocCheck(n * sizeof(float));
    float* full_v = (float*)mallocCheck(n * sizeof(float));
    for (int r = 0; r < writers; r++) {
        state_path(path, sizeof(path), dir, step, r);
        TrainState theirs;
        int ignored;
        fp = checkpoint_open_state(path, run, &theirs, loader_bytes, &owned, &ignored);
        if (theirs.step != s->step || theirs.num_processes != writers || theirs.rank != r) {
            fatal("%s: step %d, rank %d of %d does not belong with step %d of %d processes", path, theirs.step,
                  theirs.rank, theirs.num_processes, s->step, writers);
        }
        s->unverified |= theirs.unverified;
        ZeroLayout z;
        zero_layout_init(&z, run, writers, r);
        float* packed_m = (float*)mallocCheck(owned * sizeof(float));
        float* packed_v = (float*)mallocCheck(owned * sizeof(float));
        fseekCheck(fp, (long)loader_bytes, SEEK_CUR);
        checkpoint_read_moments(fp, path, packed_m, packed_v, owned);
        zero_unpack(full_m, packed_m, &z);
        zero_unpack(full_v, packed_v, &z);
        fcloseCheck(fp);
        free(packed_m);
        free(packed_v);
        zero_layout_free(&z);
    }
    ZeroLayout mine;
    zero_layout_init(&mine, run, P, rank);
    zero_pack(m, full_m, &mine);
    zero_pack(v, full_v, &mine);
    zero_layout_free(&mine);
    free(full_m);
    free(full_v);
    return ffn_ints;
}

// why the checkpoint of `step` in dir is not complete, into why: the first of its files that is missing,
// or a state file without a whole header; 0 when it is complete (the contents are checked when loaded)
static inline int checkpoint_incomplete(const char* dir, int step, char* why, size_t len) {
    char path[4096];
    model_path(path, sizeof(path), dir, step);
    if (access(path, R_OK) != 0) { snprintf(why, len, "%s is missing", path); return 1; }
    state_path(path, sizeof(path), dir, step, 0);
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) { snprintf(why, len, "%s is missing", path); return 1; }
    int32_t h[CKPT_HEADER_INTS];
    int ok = fread(h, sizeof(int32_t), CKPT_HEADER_INTS, fp) == CKPT_HEADER_INTS && h[0] == CKPT_STATE_MAGIC &&
             h[18] >= 1 && h[18] <= CKPT_MAX_PROCESSES;
    fclose(fp);
    if (!ok) { snprintf(why, len, "%s is cut short or not a state file", path); return 1; }
    for (int r = 1; r < h[18]; r++) {
        state_path(path, sizeof(path), dir, step, r);
        if (access(path, R_OK) != 0) { snprintf(why, len, "%s of the %d processes' is missing", path, h[18]); return 1; }
    }
    return 0;
}

static inline int checkpoint_complete(const char* dir, int step) {
    char why[4200];
    return !checkpoint_incomplete(dir, step, why, sizeof(why));
}

// what checkpoint_newest looks for
enum { CKPT_ANY_FILE, CKPT_MODEL_FILE, CKPT_COMPLETE };

// the newest step below `before` in dir with a file of a checkpoint (CKPT_ANY_FILE: model_<step>.bin or a
// state_<step>_<rank>.bin), a model file (CKPT_MODEL_FILE) or a complete checkpoint (CKPT_COMPLETE); -1 if none
static inline int checkpoint_newest(const char* dir, int what, int before) {
    DIR* d = opendir(dir);
    if (d == NULL) { return -1; }
    int best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int step, rank, end = 0;
        int match = sscanf(e->d_name, "model_%d.bin%n", &step, &end) == 1 && end > 0 && e->d_name[end] == '\0';
        if (!match && what == CKPT_ANY_FILE) {
            end = 0;
            match = sscanf(e->d_name, "state_%d_%d.bin%n", &step, &rank, &end) == 2 && end > 0 && e->d_name[end] == '\0';
        }
        if (!match || step <= best || step >= before) { continue; }
        if (what != CKPT_COMPLETE || checkpoint_complete(dir, step)) { best = step; }
    }
    closedir(d);
    return best;
}

// path, or when it is a directory its newest model file (model_<step>.bin), into out; 0 if the directory has none
static inline int checkpoint_model_file(const char* path, char* out, size_t len) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(out, len, "%s", path);
        return 1;
    }
    int newest = checkpoint_newest(path, CKPT_MODEL_FILE, INT_MAX);
    if (newest >= 0) { model_path(out, len, path, newest); }
    return newest >= 0;
}

// The model file a -m flag names (checkpoint_model_file), written to buf (len bytes); given 0: the flag was
// not given and path is the default directory. Where there is none, a one-line error says what to do.
static inline const char* checkpoint_model_arg(const char* path, int given, char* buf, size_t len) {
    int found = checkpoint_model_file(path, buf, len);
    if (!given && (!found || access(buf, F_OK) != 0)) {
        fatal("no -m given, and %s/ holds no checkpoint (model_<step>.bin): train one with ./train_gpt_sparse "
              "(on a CPU a short first run, 10 to 15 minutes), or give -m FILE", path);
    }
    if (!found) { fatal("-m %s: the directory holds no checkpoint (model_<step>.bin)", path); }
    return buf;
}

#endif // LLMC_CHECKPOINT_H
