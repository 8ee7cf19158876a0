/* Sampling's random draws, one generator per sentence, as PyTorch's CPU
 * generator makes them: `torch.Generator().manual_seed(seed)` is a 32-bit
 * Mersenne Twister (MT19937) seeded with the seed's low 32 bits, and
 * `exponential_()` on a tensor fills it element by element with
 * -log1p(-u), u = (the 53 low bits of a 64-bit draw: two 32-bit outputs,
 * the first the high half) / 2^53, computed in double and rounded to the
 * tensor's type. Drawing here for every sentence of a step is one call
 * instead of one PyTorch call per sentence; the caller checks once per
 * process that these draws are PyTorch's, bit for bit (decoding/sampling.py).
 *
 * A generator's state: STATE_WORDS uint32 (the MT19937 words, then how many
 * outputs are left before the next twist, then the next word's index),
 * as PyTorch's mt19937_engine keeps them.
 */
#include <math.h>
#include <stdint.h>

#include "native.h"

enum { N = 624, M = 397, LEFT = N, NEXT = N + 1, STATE_WORDS = N + 2 };
_Static_assert((int)STATE_WORDS == (int)FH_GENERATOR_STATE_WORDS, "a generator's state is native.h's size");

#define MATRIX_A 0x9908b0dfu
#define UPPER 0x80000000u
#define LOWER 0x7fffffffu

static inline uint32_t twist(uint32_t u, uint32_t v) {
    return ((((u & UPPER) | (v & LOWER)) >> 1) ^ (v & 1u ? MATRIX_A : 0u));
}

static void next_state(uint32_t *state) {
    uint32_t *p = state;
    for (int j = N - M + 1; --j; p++) *p = p[M] ^ twist(p[0], p[1]);
    for (int j = M; --j; p++) *p = p[M - N] ^ twist(p[0], p[1]);
    *p = p[M - N] ^ twist(p[0], state[0]);
    state[LEFT] = N;
    state[NEXT] = 0;
}

static inline uint32_t next_output(uint32_t *state) {
    if (--state[LEFT] == 0) next_state(state);
    uint32_t y = state[state[NEXT]++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

static inline double exponential(uint32_t *state) {
    const uint64_t high = next_output(state), low = next_output(state);
    const double u = (double)(((high << 32) | low) & ((UINT64_C(1) << 53) - 1)) * (1.0 / (double)(UINT64_C(1) << 53));
    return -1.0 * log1p(-u);
}

/* states (n, STATE_WORDS): generator i seeded with seeds[i]. */
void seed_generators(const uint64_t *seeds, int64_t n, uint32_t *states) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t *state = states + i * STATE_WORDS;
        state[0] = (uint32_t)(seeds[i] & 0xffffffffu);
        for (uint32_t j = 1; j < N; ++j) state[j] = 1812433253u * (state[j - 1] ^ (state[j - 1] >> 30)) + j;
        state[LEFT] = 1;
        state[NEXT] = 0;
    }
}

/* Row i of out (n rows of `per` values, float32 where `single`, else
 * float64) drawn from generator i of states, in order. */
void exponential_draws(uint32_t *states, int64_t n, int64_t per, int single, void *out) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t *state = states + i * STATE_WORDS;
        if (single) {
            float *row = (float *)out + i * per;
            for (int64_t j = 0; j < per; ++j) row[j] = (float)exponential(state);
        } else {
            double *row = (double *)out + i * per;
            for (int64_t j = 0; j < per; ++j) row[j] = exponential(state);
        }
    }
}
