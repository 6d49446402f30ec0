/* simd.h: the small vector vocabulary the kernels are written in, one file per ISA.
 *
 * vf is 16 floats: one __m512 (DS4K_ISA 2), two __m256 (1) or a plain array (0, portable C
 * the compiler may vectorize itself). vb is 16 bytes: __m128i, or an array. va is a
 * native-width sum, av attention's native vector (AW lanes; AR, AKV, ADV: the shape of its
 * register tiles). A block kernel written once against these (unpack nibbles into a vb,
 * widen to a vf, FMA against x) runs on every ISA; only the lane count per instruction
 * differs. Every ISA computes the same products up to float summation order.
 *
 * Each ISA's definitions live in their own file, the way ggml-cpu keeps one per architecture:
 * simd_scalar.h, simd_avx2.h and simd_avx512.h (simd_x86.h: what the two vector builds
 * share), chosen here by DS4K_ISA, the variant isa.c is being compiled as (build.py passes
 * it with that variant's flags). The loops of the step, the decode attention and finite.c
 * are theirs too (vec_*.h, through vec.h).
 */
#ifndef DS4K_SIMD_H
#define DS4K_SIMD_H

#include <math.h>

#include "ds4k.h"

#ifndef DS4K_ISA
#define DS4K_ISA 0
#endif

/* 2^f on [-0.5, 0.5]: 1 + f (C1 + f (C2 + ...)), a least-squares fit at Chebyshev nodes,
 * within 1.7 ulp in float (Horner rounding included). attn.c keeps scores in base 2
 * (q scaled by log2 e), so its softmax's exponential is a round, a subtraction, this
 * polynomial and a scale by 2^n (av_exp2). */
#define EXP2_C1 6.93147182e-01f
#define EXP2_C2 2.40226477e-01f
#define EXP2_C3 5.55032901e-02f
#define EXP2_C4 9.61837359e-03f
#define EXP2_C5 1.33998482e-03f
#define EXP2_C6 1.53707049e-04f

#if DS4K_ISA == 2
#include "simd_avx512.h"
#elif DS4K_ISA == 1
#include "simd_avx2.h"
#elif DS4K_ISA == 0
#include "simd_scalar.h"
#else
#error "DS4K_ISA: 0 (portable C), 1 (AVX2) or 2 (AVX-512)"
#endif

#endif
