/*
 Deterministic random numbers for initialisation, data shuffling, dropout-free
 sampling and tests: splitmix64 (a 64-bit state, trivially saved in a
 checkpoint), an unbiased bounded integer, uniforms and Box-Muller normals.
*/
#ifndef LLMC_RNG_H
#define LLMC_RNG_H

#include <math.h>
#include <stdint.h>

// the splitmix64 finaliser: a bijective scramble of 64 bits, also used to derive seeds
static inline uint64_t rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rng_next(uint64_t* state) {
    return rng_mix64(*state += 0x9E3779B97F4A7C15ull);
}

// uniform integer in [0, n), n > 0, without modulo bias (rejection sampling)
static inline uint64_t rng_below(uint64_t* state, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do { r = rng_next(state); } while (r >= limit);
    return r % n;
}

// uniform in [0, 1) with 53 random bits
static inline double rng_uniform(uint64_t* state) {
    return (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

// standard normal (Box-Muller; one of the pair is discarded to keep the state simple)
static inline double rng_normal(uint64_t* state) {
    double u1 = rng_uniform(state), u2 = rng_uniform(state);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

#endif // LLMC_RNG_H
