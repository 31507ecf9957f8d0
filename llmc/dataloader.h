/*
 Data loader over llm.c token shards matched by a glob. A sample is T+1
 consecutive tokens starting at a multiple of T (inputs: the first T, targets:
 the last T); a global batch is B * num_processes samples, of which process
 `rank` takes the B at offset rank * B, so P processes together read exactly
 what one process with batch size B * P would. Shuffling permutes the shard
 order and the sample order inside each shard, as a pure function of (seed,
 epoch, shard), so a position (epoch, shard, batch) is all a resume needs.
 Only the current shard is in memory.
*/
#ifndef LLMC_DATALOADER_H
#define LLMC_DATALOADER_H

#include <glob.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmc/rng.h"
#include "llmc/shard.h"
#include "llmc/utils.h"

// independent stream for (seed, epoch, stream): stream 0 orders the shards,
// stream 1 + i orders the samples of shard file i
static inline uint64_t dl_stream_seed(uint64_t seed, uint64_t epoch, uint64_t stream) {
    return rng_mix64(rng_mix64(rng_mix64(seed) ^ epoch) ^ stream);
}

// order[0..n) = 0..n-1, Fisher-Yates shuffled with the given stream if shuffle
static inline void dl_fill_order(size_t* order, size_t n, int shuffle, uint64_t stream_seed) {
    for (size_t i = 0; i < n; i++) { order[i] = i; }
    if (!shuffle) { return; }
    uint64_t state = stream_seed;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)rng_below(&state, (uint64_t)i + 1);
        size_t tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
}

// ----------------------------------------------------------------------------

typedef struct {
    // configuration, fixed after init
    int B, T;
    int process_rank, num_processes;
    int shuffle;
    uint64_t seed;
    int vocab_size;
    glob_t glob_result;
    size_t num_shards;
    char** shard_paths;          // num_shards paths, sorted (points into glob_result)
    size_t* shard_num_tokens;    // from each header, checked again when loaded
    size_t num_tokens;           // total over all shards
    // position: the next batch is global batch batch_pos of shard
    // shard_order[shard_pos] in epoch `epoch`
    uint64_t epoch;
    size_t shard_pos;
    size_t batch_pos;
    size_t* shard_order;         // this epoch's order of shard file indices
    size_t* sample_order;        // the current shard's order of sample indices
    size_t sample_order_capacity;
    // the current shard in memory
    Shard shard;
    size_t loaded_shard;         // file index of shard, or SIZE_MAX when none
    // the shard that comes next, read by a background thread while training goes on
    Shard next_shard;
    size_t next_file;            // file index being read into next_shard, or SIZE_MAX
    pthread_t prefetch_thread;
    // the batch, B * T each, filled by dataloader_next_batch
    int* inputs;
    int* targets;
} DataLoader;

// the largest epoch a state may hold. Each micro-batch advances the epoch by at most one and a run
// has fewer than 2^60 of them (at most 2^30 steps of at most 2^30 tokens), so from here the
// counter has room to go on; a larger one is a corrupt state, refused on load
#define DL_MAX_EPOCH ((uint64_t)1 << 62)

// where a loader is, plus the configuration it must be restored into; fixed
// width fields so it can be written into a checkpoint as is. The same state
// serves every process rank, and any split of the same global batch.
typedef struct {
    uint64_t seed;
    uint64_t epoch;
    uint64_t shard_pos;
    uint64_t batch_pos;
    uint64_t num_shards;
    uint64_t num_tokens;
    int32_t B, T;
    int32_t num_processes;
    int32_t shuffle;
} DataLoaderState;

// samples in shard file i: sample s covers tokens [s*T, s*T + T] inclusive
static inline size_t dataloader_shard_samples(const DataLoader* dl, size_t file_index) {
    return (dl->shard_num_tokens[file_index] - 1) / (size_t)dl->T;
}

// global batches in shard file i; the last samples that do not fill one are skipped
static inline size_t dataloader_shard_batches(const DataLoader* dl, size_t file_index) {
    return dataloader_shard_samples(dl, file_index) / ((size_t)dl->B * (size_t)dl->num_processes);
}

// batches each process gets per epoch (for a full pass over val data)
static inline size_t dataloader_num_batches(const DataLoader* dl) {
    size_t n = 0;
    for (size_t i = 0; i < dl->num_shards; i++) { n += dataloader_shard_batches(dl, i); }
    return n;
}

// total tokens in the matched shards
static inline size_t dataloader_num_tokens(const DataLoader* dl) {
    return dl->num_tokens;
}

// read and validate shard file file_index into dst. It reads only the fixed
// configuration of dl, so it can run on another thread while dl serves batches.
static inline void dataloader_load_shard(const DataLoader* dl, size_t file_index, Shard* dst) {
    const char* path = dl->shard_paths[file_index];
    shard_load_or_die(path, dl->vocab_size, dst);
    if (dst->num_tokens != dl->shard_num_tokens[file_index]) {
        fatal("%s: shard changed while in use (had %zu tokens when the loader opened it, now %zu)",
              path, dl->shard_num_tokens[file_index], dst->num_tokens);
    }
}

// the background read of the next shard (file reads overlap the training steps)
static inline void* dataloader_prefetch_main(void* arg) {
    DataLoader* dl = (DataLoader*)arg;
    dataloader_load_shard(dl, dl->next_file, &dl->next_shard);
    return NULL;
}

// waits for a prefetch in flight; returns the file index it read, or SIZE_MAX
static inline size_t dataloader_prefetch_join(DataLoader* dl) {
    size_t file = dl->next_file;
    if (file != SIZE_MAX) {
        if (pthread_join(dl->prefetch_thread, NULL) != 0) { fatal("cannot join the shard prefetch thread"); }
        dl->next_file = SIZE_MAX;
    }
    return file;
}

// starts reading the shard after the current one (the next epoch's first, after
// the last) unless it is the one already in memory
static inline void dataloader_prefetch_start(DataLoader* dl) {
    size_t next;
    if (dl->shard_pos + 1 < dl->num_shards) {
        next = dl->shard_order[dl->shard_pos + 1];
    } else {
        size_t* order = (size_t*)mallocCheck(dl->num_shards * sizeof(size_t));
        dl_fill_order(order, dl->num_shards, dl->shuffle, dl_stream_seed(dl->seed, dl->epoch + 1, 0));
        next = order[0];
        free(order);
    }
    if (next == dl->loaded_shard) { return; }
    dl->next_file = next;
    if (pthread_create(&dl->prefetch_thread, NULL, dataloader_prefetch_main, dl) != 0) {
        fatal("cannot start the shard prefetch thread");
    }
}

// move to (epoch, shard_pos, batch_pos): recompute the orders and load the shard if it is not in memory
static inline void dataloader_seek(DataLoader* dl, uint64_t epoch, size_t shard_pos, size_t batch_pos) {
    dl->epoch = epoch;
    dl->shard_pos = shard_pos;
    dl->batch_pos = batch_pos;
    dl_fill_order(dl->shard_order, dl->num_shards, dl->shuffle, dl_stream_seed(dl->seed, epoch, 0));
    size_t file_index = dl->shard_order[shard_pos];
    size_t num_samples = dataloader_shard_samples(dl, file_index);
    if (num_samples > dl->sample_order_capacity) {
        free(dl->sample_order);
        dl->sample_order = (size_t*)mallocCheck(num_samples * sizeof(size_t));
        dl->sample_order_capacity = num_samples;
    }
    dl_fill_order(dl->sample_order, num_samples, dl->shuffle,
                  dl_stream_seed(dl->seed, epoch, 1 + (uint64_t)file_index));
    // take the prefetched shard if it is the one wanted, else read it now
    size_t prefetched = dataloader_prefetch_join(dl);
    if (dl->loaded_shard != file_index) {
        if (prefetched == file_index) {
            Shard swap = dl->shard;
            dl->shard = dl->next_shard;
            dl->next_shard = swap;
        } else {
            dataloader_load_shard(dl, file_index, &dl->shard);
        }
        dl->loaded_shard = file_index;
    }
    dataloader_prefetch_start(dl);
}

static inline int dl_cmp_paths(const void* a, const void* b) {
    return strcmp(*(char* const*)a, *(char* const*)b);
}

// dataloader_init that reports a bad pattern, configuration or shard header
// as -1 with a one-line message in err instead of exiting (the loader then
// holds nothing); a bad token in the first shard is still fatal
static inline int dataloader_try_init(DataLoader* dl, const char* pattern, int B, int T, int process_rank,
                                      int num_processes, int shuffle, uint64_t seed, int vocab_size,
                                      char* err, size_t errlen) {
    memset(dl, 0, sizeof(*dl));
    dl->next_file = SIZE_MAX;
    if (B <= 0 || T <= 0 || num_processes <= 0 || process_rank < 0 || process_rank >= num_processes ||
        vocab_size <= 0) {
        return shard_error(err, errlen,
                           "%s: bad data loader settings B=%d T=%d process %d of %d vocab size %d",
                           pattern, B, T, process_rank, num_processes, vocab_size);
    }
    // sorted with strcmp ourselves: glob's own sort follows the locale
    int rc = glob(pattern, GLOB_NOSORT, NULL, &dl->glob_result);
    if (rc != 0) {
        globfree(&dl->glob_result);
        if (rc == GLOB_NOMATCH) {
            return shard_error(err, errlen, "no files match the shard pattern '%s'", pattern);
        }
        return shard_error(err, errlen, "cannot expand the shard pattern '%s' (%s)", pattern,
                           rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    dl->num_shards = dl->glob_result.gl_pathc;
    dl->shard_paths = dl->glob_result.gl_pathv;
    qsort(dl->shard_paths, dl->num_shards, sizeof(char*), dl_cmp_paths);
    dl->shard_num_tokens = (size_t*)mallocCheck(dl->num_shards * sizeof(size_t));
    // every sample of one global batch, plus the final target token
    size_t need = (size_t)B * (size_t)T * (size_t)num_processes + 1;
    for (size_t i = 0; i < dl->num_shards; i++) {
        ShardInfo info = {0, 0};
        int bad = shard_read_header(dl->shard_paths[i], &info, err, errlen) != 0;
        if (!bad && info.num_tokens < need) {
            bad = shard_error(err, errlen,
                              "%s: shard has %zu tokens, fewer than the %zu one global batch needs "
                              "(B=%d * T=%d * %d processes + 1)",
                              dl->shard_paths[i], info.num_tokens, need, B, T, num_processes);
        }
        if (bad) {
            free(dl->shard_num_tokens);
            globfree(&dl->glob_result);
            memset(dl, 0, sizeof(*dl));
            return -1;
        }
        dl->shard_num_tokens[i] = info.num_tokens;
        dl->num_tokens += info.num_tokens;
    }
    dl->B = B;
    dl->T = T;
    dl->process_rank = process_rank;
    dl->num_processes = num_processes;
    dl->shuffle = shuffle != 0;
    dl->seed = seed;
    dl->vocab_size = vocab_size;
    dl->shard_order = (size_t*)mallocCheck(dl->num_shards * sizeof(size_t));
    dl->loaded_shard = SIZE_MAX;
    dl->inputs = (int*)mallocCheck((size_t)B * (size_t)T * sizeof(int));
    dl->targets = (int*)mallocCheck((size_t)B * (size_t)T * sizeof(int));
    dataloader_seek(dl, 0, 0, 0);
    return 0;
}

// open the shards matching pattern (a glob) for process process_rank of
// num_processes; shuffle=1 for training, 0 for val (file order); any problem is fatal
static inline void dataloader_init(DataLoader* dl, const char* pattern, int B, int T, int process_rank,
                                   int num_processes, int shuffle, uint64_t seed, int vocab_size) {
    char err[SHARD_ERR_LEN];
    if (dataloader_try_init(dl, pattern, B, T, process_rank, num_processes, shuffle, seed, vocab_size,
                            err, sizeof(err)) != 0) {
        fatal("%s", err);
    }
}

// fill dl->inputs and dl->targets with this process's next B samples; after
// the last batch of the last shard the next epoch begins
static inline void dataloader_next_batch(DataLoader* dl) {
    if (dl->batch_pos >= dataloader_shard_batches(dl, dl->shard_order[dl->shard_pos])) {
        if (dl->shard_pos + 1 < dl->num_shards) {
            dataloader_seek(dl, dl->epoch, dl->shard_pos + 1, 0);
        } else {
            dataloader_seek(dl, dl->epoch + 1, 0, 0);
        }
    }
    size_t B = (size_t)dl->B, T = (size_t)dl->T;
    const size_t* samples = dl->sample_order + dl->batch_pos * B * (size_t)dl->num_processes +
                            (size_t)dl->process_rank * B;
    for (size_t b = 0; b < B; b++) {
        size_t start = samples[b] * T;
        for (size_t t = 0; t < T; t++) {
            // tokens are < vocab_size, an int, so they fit
            dl->inputs[b * T + t] = (int)shard_token(&dl->shard, start + t);
            dl->targets[b * T + t] = (int)shard_token(&dl->shard, start + t + 1);
        }
    }
    dl->batch_pos++;
}

// back to the first batch of epoch 0 (for another pass over val data)
static inline void dataloader_reset(DataLoader* dl) {
    dataloader_seek(dl, 0, 0, 0);
}

static inline DataLoaderState dataloader_get_state(const DataLoader* dl) {
    DataLoaderState s;
    memset(&s, 0, sizeof(s));
    s.seed = dl->seed;
    s.epoch = dl->epoch;
    s.shard_pos = dl->shard_pos;
    s.batch_pos = dl->batch_pos;
    s.num_shards = dl->num_shards;
    s.num_tokens = dl->num_tokens;
    s.B = dl->B;
    s.T = dl->T;
    s.num_processes = dl->num_processes;
    s.shuffle = dl->shuffle;
    return s;
}

// continue from a state saved by dataloader_get_state (it takes over the
// state's seed); a state for other data or another configuration is -1 with
// a one-line message naming the field
static inline int dataloader_try_set_state(DataLoader* dl, const DataLoaderState* s, char* err, size_t errlen) {
    struct { const char* name; uint64_t saved, have; } fields[] = {
        {"num_shards", s->num_shards, dl->num_shards},
        {"num_tokens", s->num_tokens, dl->num_tokens},
        {"T", (uint64_t)s->T, (uint64_t)dl->T},
        {"shuffle", (uint64_t)s->shuffle, (uint64_t)dl->shuffle},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].saved != fields[i].have) {
            return shard_error(err, errlen, "data loader state does not match the data: %s is %llu in the state, %llu here",
                               fields[i].name, (unsigned long long)fields[i].saved, (unsigned long long)fields[i].have);
        }
    }
    if (s->epoch > DL_MAX_EPOCH) {
        return shard_error(err, errlen, "data loader state is corrupt: epoch %llu, expected at most %llu (room for "
                           "the run to go on)", (unsigned long long)s->epoch, (unsigned long long)DL_MAX_EPOCH);
    }
    if (s->shard_pos >= dl->num_shards) {
        return shard_error(err, errlen, "data loader state is corrupt: shard %llu of %zu",
                           (unsigned long long)s->shard_pos, dl->num_shards);
    }
    // the position in samples, in global batches of this loader (whose B and
    // process count may differ from the writer's: a run resumed on other GPUs);
    // bounded first by a division, since the product of the three could wrap
    // (no shard holds 2^31 samples)
    if (s->B <= 0 || s->num_processes <= 0 ||
        s->batch_pos > (uint64_t)INT32_MAX / ((uint64_t)s->B * (uint64_t)s->num_processes)) {
        return shard_error(err, errlen, "data loader state is corrupt: batch %llu of %d x %d processes is past any shard",
                           (unsigned long long)s->batch_pos, s->B, s->num_processes);
    }
    uint64_t sample_pos = s->batch_pos * (uint64_t)s->B * (uint64_t)s->num_processes;
    uint64_t global_batch = (uint64_t)dl->B * (uint64_t)dl->num_processes;
    if (sample_pos % global_batch != 0) {
        return shard_error(err, errlen, "data loader state at sample %llu (batches of %d x %d processes) is not a "
                           "multiple of this run's %d x %d", (unsigned long long)sample_pos, s->B, s->num_processes,
                           dl->B, dl->num_processes);
    }
    size_t batch_pos = (size_t)(sample_pos / global_batch);
    // which shard batch_pos refers to depends on the state's seed and epoch
    size_t* order = (size_t*)mallocCheck(dl->num_shards * sizeof(size_t));
    dl_fill_order(order, dl->num_shards, dl->shuffle, dl_stream_seed(s->seed, s->epoch, 0));
    size_t batches = dataloader_shard_batches(dl, order[s->shard_pos]);
    free(order);
    if (batch_pos > batches) {
        return shard_error(err, errlen, "data loader state is corrupt: batch %zu of a shard with %zu batches",
                           batch_pos, batches);
    }
    dl->seed = s->seed;
    dataloader_seek(dl, s->epoch, (size_t)s->shard_pos, batch_pos);
    return 0;
}

// dataloader_try_set_state for a state read from the file `source`, which an error names
static inline void dataloader_set_state(DataLoader* dl, const DataLoaderState* s, const char* source) {
    char err[SHARD_ERR_LEN];
    if (dataloader_try_set_state(dl, s, err, sizeof(err)) != 0) {
        fatal("%s: %s", source, err);
    }
}

static inline void dataloader_free(DataLoader* dl) {
    dataloader_prefetch_join(dl);
    shard_free(&dl->shard);
    shard_free(&dl->next_shard);
    free(dl->sample_order);
    free(dl->shard_order);
    free(dl->shard_num_tokens);
    free(dl->inputs);
    free(dl->targets);
    globfree(&dl->glob_result);
    memset(dl, 0, sizeof(*dl));
}

#endif // LLMC_DATALOADER_H
