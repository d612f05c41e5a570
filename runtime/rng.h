/* runtime/rng.h — counter-based random numbers, reproducible under any layout.
 *
 * Value `index` of stream `stream` under `seed` is a pure function of the three numbers, so
 * a tensor initialised whole, or row-slice by row-slice on different ranks, gets the same
 * values; no generator state has to travel or be checkpointed. A parameter's stream is the
 * hash of its DESIGN 2.3 name.
 */
#ifndef FATHOM_RUNTIME_RNG_H
#define FATHOM_RUNTIME_RNG_H

#include <stddef.h>
#include <stdint.h>

/* 64 random bits: splitmix64 finalisers over (seed, stream, index). */
uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Element `index` of the stream's standard normals: Box-Muller over the uniforms at 2p and
 * 2p+1 of its pair p = index / 2, in double with libm's log, cos (even index) and sin (odd):
 * sqrt(-2 log(1 - u_2p)) * cos|sin(2 pi u_2p+1). This is the definition rng_fill_normal
 * follows bit for bit. */
double rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* x[i] = (float)(mean + std * rng_normal(seed, stream, first + i)), i < n, bit for bit,
 * over OpenMP threads (a faster route to the same floats: rng.c). */
void rng_fill_normal(float *x, size_t n, uint64_t first, double mean, double std,
                     uint64_t seed, uint64_t stream);
/* FNV-1a 64 of a string: the stream of a named tensor. */
uint64_t rng_stream_of_name(const char *name);

#endif
