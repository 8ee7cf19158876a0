/* Exponentials in a form the compiler vectorises (expf is a scalar call
 * without -ffast-math): a degree-6 polynomial of 2^f on [-1/2, 1/2] and the
 * exponent set by hand, relative error ~2e-7. Shared by the kernels that
 * sum exponentials (kernels/__init__.py hashes it into their builds). */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^y for -126 <= y <= 0 (the caller clamps) */
static inline float exp2_poly(float y) {
    float n = floorf(y + 0.5f);
    float f = y - n;
    float p = 1.535336188e-4f;
    p = fmaf(p, f, 1.339887440e-3f);
    p = fmaf(p, f, 9.618437357e-3f);
    p = fmaf(p, f, 5.550332471e-2f);
    p = fmaf(p, f, 2.402264791e-1f);
    p = fmaf(p, f, 6.931472028e-1f);
    p = fmaf(p, f, 1.0f);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* e^x for x <= 0; 0 where it is below 2^-126 (-inf included; the clamp
 * keeps the vectorised lanes that are not returned in range too) */
static inline float exp_nonpositive(float x) {
    const float y = x * 1.4426950408889634f;
    return y < -126.0f ? 0.0f : exp2_poly(y < -126.0f ? -126.0f : y);
}
