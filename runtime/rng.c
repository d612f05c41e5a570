/* runtime/rng.c — see rng.h. */
#include "runtime/rng.h"

#include <math.h>
#include <stdbool.h>

static const uint64_t golden = 0x9E3779B97F4A7C15ull;

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The part of rng_bits that depends on (seed, stream) alone: a fill computes it once. */
static uint64_t stream_key(uint64_t seed, uint64_t stream)
{
    uint64_t key = mix64(seed + golden) ^ mix64(stream * golden + 0x632BE59BD9B4E019ull);
    return mix64(key);
}

static double uniform_of_bits(uint64_t bits)
{
    return (double)(bits >> 11) * 0x1.0p-53;
}

uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index)
{
    return mix64(stream_key(seed, stream) + (index + 1) * golden);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return uniform_of_bits(rng_bits(seed, stream, index));
}

double rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* both members of a Box-Muller pair come from the pair's two uniforms */
    uint64_t pair = index / 2;
    double u1 = rng_uniform(seed, stream, 2 * pair);
    double u2 = rng_uniform(seed, stream, 2 * pair + 1);
    double radius = sqrt(-2.0 * log(1.0 - u1)); /* 1 - u1 is in (0, 1] */
    double angle = 2.0 * M_PI * u2;
    return index % 2 == 0 ? radius * cos(angle) : radius * sin(angle);
}

/* sin and cos of an angle in [0, 2 pi], to about 2^-50 relative to each result (zeros
 * included): the angle is reduced to r in [-pi/4, pi/4] by a multiple k of pi/2 in three
 * parts (the first is exact, so r keeps its relative accuracy next to a zero), then
 * fdlibm's minimax polynomials for sin and cos on [-pi/4, pi/4] (error < 2^-58). */
static void sincos_fast(double angle, double *sine, double *cosine)
{
    static const double two_over_pi = 6.36619772367581382433e-01;
    static const double pio2_1 = 1.57079632673412561417e+00;  /* first 33 bits of pi/2 */
    static const double pio2_2 = 6.07710050630396597660e-11;  /* next 33 bits */
    static const double pio2_2t = 2.02226624879595063154e-21; /* pi/2 - pio2_1 - pio2_2 */
    static const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                        S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                        S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
    static const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                        C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                        C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
    int k = (int)(angle * two_over_pi + 0.5);
    double r = ((angle - k * pio2_1) - k * pio2_2) - k * pio2_2t;
    double z = r * r;
    double s = r + r * z * (S1 + z * (S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))));
    double c = 1.0 - 0.5 * z + z * z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))));
    /* sin(k pi/2 + r), cos(k pi/2 + r) by quadrant, without branches: k is random, and a
     * mispredicted switch here cost more than the polynomials */
    static const double sign[2] = {1.0, -1.0};
    const double sin_cos_r[2] = {s, c};
    *sine = sin_cos_r[k & 1] * sign[(k >> 1) & 1];
    *cosine = sin_cos_r[(k + 1) & 1] * sign[((k + 1) >> 1) & 1];
}

/* (float)(mean + std * normal) where normal is the fast radius * trig, when that float is
 * certainly the one the exact libm expression rounds to: the two differ by less than
 * `margin`, so if both ends of [value - margin, value + margin] round to one float, so does
 * the libm value (rounding is monotonic). Returns false when the interval straddles a
 * rounding boundary: about one element in 3000, which the caller recomputes with libm. */
static bool round_certainly(double mean, double std, double normal, float *out)
{
    double value = mean + std * normal;
    /* 2^-36 of |std * normal| covers the polynomial, the reduction and libm's own ulp with
     * room to spare; 2^-50 of |value| the roundings of the two sums */
    double margin = fabs(std * normal) * 0x1.0p-36 + fabs(value) * 0x1.0p-50 + 0x1.0p-1000;
    float low = (float)(value - margin), high = (float)(value + margin);
    *out = low;
    return low == high;
}

void rng_fill_normal(float *x, size_t n, uint64_t first, double mean, double std,
                     uint64_t seed, uint64_t stream)
{
    if (n == 0)
        return;
    const uint64_t key = stream_key(seed, stream);
    const uint64_t first_pair = first / 2, end_pair = (first + n + 1) / 2;
    /* Each pair writes only its own two elements, so the threads' split cannot change a bit.
     * One libm log, cos and sin per element took about 33 ns on one core here (6 s for a
     * 180M-parameter model); one log per pair and sincos_fast take about 14
     * (docs/performance.md). */
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (uint64_t pair = first_pair; pair < end_pair; pair++) {
        double u1 = uniform_of_bits(mix64(key + (2 * pair + 1) * golden));
        double u2 = uniform_of_bits(mix64(key + (2 * pair + 2) * golden));
        double radius = sqrt(-2.0 * log(1.0 - u1));
        double angle = 2.0 * M_PI * u2;
        double sine, cosine;
        sincos_fast(angle, &sine, &cosine);
        const double trig[2] = {cosine, sine};
        for (uint64_t element = 2 * pair; element < 2 * pair + 2; element++) {
            if (element < first || element >= first + n)
                continue; /* the other half of a pair at the range's ends */
            float value;
            if (!round_certainly(mean, std, radius * trig[element % 2], &value))
                value = (float)(mean + std * rng_normal(seed, stream, element));
            x[element - first] = value;
        }
    }
}

uint64_t rng_stream_of_name(const char *name)
{
    uint64_t hash = 0xCBF29CE484222325ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) {
        hash ^= *c;
        hash *= 0x100000001B3ull;
    }
    return hash;
}
