/* vec.h: the vector parts of the loops of the fused step (llama_step.c), the decode attention
 * (attn.c) and finite.c, one file per ISA: vec_scalar.h, vec_avx2.h, vec_avx512.h (vec_x86.h:
 * the AVX2 loops both vector builds run), chosen by DS4K_ISA as simd.h chooses its own.
 *
 * Each `*_vec` runs the vector part of its caller's loop from the start and returns how far it
 * got (a partial sum or max through a pointer); the caller's scalar tail, the same for every
 * ISA, finishes the rest. So the shared files hold the algorithms and the tails, these files
 * the intrinsics, and each build compiles to the instructions it did with the loops inline.
 */
#ifndef DS4K_VEC_H
#define DS4K_VEC_H

#include "simd.h"

/* The decode attention's limits (attn.c): query heads per KV head, and the longest block of
 * positions (the rows of its weights, which the AVX-512 V path reads). */
#define MAX_GROUP 16
#define ATT_BLOCK_MAX 1024 /* blocks double while the layer keeps >= ATT_MIN_CHUNKS of them */

#if DS4K_ISA == 2
#include "vec_avx512.h"
#elif DS4K_ISA == 1
#include "vec_avx2.h"
#else
#include "vec_scalar.h"
#endif

#endif
