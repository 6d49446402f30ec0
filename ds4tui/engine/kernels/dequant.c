/* dequant.c: GGUF blocks -> fp32, exactly the values gguf.quants.dequantize computes.
 *
 * Owns: dequant_row (one row of any ds4k type; qgemm.c dequantizes its tiles with it),
 * dequant_rows_t32 (32 rows at once, transposed: qgemm.c's long-product layout; vector ISAs),
 * q4_1_bytes32 / q4_1_bytes_col16 (Q4_1 regrouped for qgemm.c's fused AVX-512 tiles) and
 * dequant (whole matrices, exported for tests and fallbacks). The block types run 16 quants
 * at a time on simd.h's vectors (dequant_row_vec; the per-element loops below stay as the
 * plain statement of each format, and for F16/BF16). Every product and sum is
 * one float32 operation in the order gguf's numpy code applies them (no FMA contraction:
 * the build passes -ffp-contract=off; q4_1_bytes_col16's one explicit FMA rounds exactly as
 * the two operations do, see there), so results are bit-identical on every ISA.
 *
 * Block layouts (GGML's, all little-endian; d, m, dmin are f16):
 *   Q4_0  d, qs[16]                 w_j = d * (q_j - 8); q_j = qs[j] & 15 (j < 16), qs[j-16] >> 4
 *   Q4_1  d, m, qs[16]              w_j = d * q_j + m
 *   Q5_0  d, qh[4], qs[16]          q_j |= bit j of qh << 4; w_j = d * (q_j - 16)
 *   Q5_1  d, m, qh[4], qs[16]       q_j |= bit j of qh << 4; w_j = d * q_j + m
 *   Q8_0  d, qs[32] (int8)          w_j = d * qs[j]
 *   Q4_K  d, dmin, scales[12], qs[128]: 8 sub-blocks of 32 with 6-bit scale sc_i and min
 *         m_i; sub-block 2c / 2c+1 are the low / high nibbles of qs[32c .. 32c+31];
 *         w = (d sc_i) q - (dmin m_i)
 *   Q5_K  d, dmin, scales[12], qh[32], qs[128]: as Q4_K, plus bit i of qh[l] as bit 4 of
 *         element l of sub-block i
 *   Q6_K  ql[128], qh[64], scales[16] (int8), d: element e = 128h + 32s + l (h < 2, s < 4,
 *         l < 32) has low 4 bits from ql[64h + 32(s & 1) + l] (>> 4 when s >= 2), high 2 bits
 *         (qh[32h + l] >> 2s) & 3; w = (d scales[e / 16]) (q - 32)
 *   Q2_K  scales[16], qs[64], d, dmin: element e = 128h + 32s + l is (qs[32h + l] >> 2s) & 3;
 *         scales[e / 16] holds its sub-block's 4-bit scale (low nibble) and min (high);
 *         w = (d sc) q - (dmin m)
 *   IQ2_XXS  d, then 8 sub-blocks of 32 as two u32: a0 = four grid indexes (one per 8
 *         weights), a1 = four 7-bit sign fields (bits 7l..7l+6) and a 4-bit scale (bits 28..31);
 *         db = d (0.5 + scale) / 4; weight j of group l = db * grid[a0 byte l][j], negated
 *         where bit j of the group's signs is set; the eighth sign bit is the parity of the
 *         seven stored ones (an even number of negatives per 8)
 */

/* IQ2_XXS's codebook (GGML's iq2xxs_grid): 256 groups of 8 magnitudes, byte j of entry k
 * = magnitude j of group k, each 8, 25 or 43 (an X-macro list: qgemv.c builds float copies
 * of this table and the sign table below from the same constants, at compile time). gguf-py keeps the same table (IQ2_XXS.grid);
 * the tests compare every entry through dequantization. */
#define IQ2XXS_GRID(X) \
    X(0x0808080808080808ull) X(0x080808080808082bull) X(0x0808080808081919ull) X(0x0808080808082b08ull) \
    X(0x0808080808082b2bull) X(0x0808080808190819ull) X(0x0808080808191908ull) X(0x08080808082b0808ull) \
    X(0x08080808082b082bull) X(0x08080808082b2b08ull) X(0x08080808082b2b2bull) X(0x0808080819080819ull) \
    X(0x0808080819081908ull) X(0x0808080819190808ull) X(0x0808080819192b08ull) X(0x08080808192b0819ull) \
    X(0x08080808192b1908ull) X(0x080808082b080808ull) X(0x080808082b08082bull) X(0x080808082b082b2bull) \
    X(0x080808082b2b082bull) X(0x0808081908080819ull) X(0x0808081908081908ull) X(0x0808081908190808ull) \
    X(0x0808081908191919ull) X(0x0808081919080808ull) X(0x080808192b081908ull) X(0x080808192b192b08ull) \
    X(0x0808082b08080808ull) X(0x0808082b0808082bull) X(0x0808082b082b082bull) X(0x0808082b2b08082bull) \
    X(0x0808190808080819ull) X(0x0808190808081908ull) X(0x0808190808190808ull) X(0x08081908082b0819ull) \
    X(0x08081908082b1908ull) X(0x0808190819080808ull) X(0x080819081908082bull) X(0x0808190819082b08ull) \
    X(0x08081908192b0808ull) X(0x080819082b080819ull) X(0x080819082b081908ull) X(0x080819082b190808ull) \
    X(0x080819082b2b1908ull) X(0x0808191908080808ull) X(0x080819190808082bull) X(0x0808191908082b08ull) \
    X(0x08081919082b0808ull) X(0x080819191908192bull) X(0x08081919192b2b19ull) X(0x080819192b080808ull) \
    X(0x080819192b190819ull) X(0x0808192b08082b19ull) X(0x0808192b08190808ull) X(0x0808192b19080808ull) \
    X(0x0808192b2b081908ull) X(0x0808192b2b2b1908ull) X(0x08082b0808080808ull) X(0x08082b0808081919ull) \
    X(0x08082b0808082b08ull) X(0x08082b0808191908ull) X(0x08082b08082b2b08ull) X(0x08082b0819080819ull) \
    X(0x08082b0819081908ull) X(0x08082b0819190808ull) X(0x08082b081919082bull) X(0x08082b082b082b08ull) \
    X(0x08082b1908081908ull) X(0x08082b1919080808ull) X(0x08082b2b0808082bull) X(0x08082b2b08191908ull) \
    X(0x0819080808080819ull) X(0x0819080808081908ull) X(0x0819080808190808ull) X(0x08190808082b0819ull) \
    X(0x0819080819080808ull) X(0x08190808192b0808ull) X(0x081908082b081908ull) X(0x081908082b190808ull) \
    X(0x081908082b191919ull) X(0x0819081908080808ull) X(0x0819081908082b08ull) X(0x08190819082b0808ull) \
    X(0x0819081919190808ull) X(0x0819081919192b2bull) X(0x081908192b080808ull) X(0x0819082b082b1908ull) \
    X(0x0819082b19081919ull) X(0x0819190808080808ull) X(0x0819190808082b08ull) X(0x08191908082b0808ull) \
    X(0x08191908082b1919ull) X(0x0819190819082b19ull) X(0x081919082b080808ull) X(0x0819191908192b08ull) \
    X(0x08191919192b082bull) X(0x0819192b08080808ull) X(0x0819192b0819192bull) X(0x08192b0808080819ull) \
    X(0x08192b0808081908ull) X(0x08192b0808190808ull) X(0x08192b0819080808ull) X(0x08192b082b080819ull) \
    X(0x08192b1908080808ull) X(0x08192b1908081919ull) X(0x08192b192b2b0808ull) X(0x08192b2b19190819ull) \
    X(0x082b080808080808ull) X(0x082b08080808082bull) X(0x082b080808082b2bull) X(0x082b080819081908ull) \
    X(0x082b0808192b0819ull) X(0x082b08082b080808ull) X(0x082b08082b08082bull) X(0x082b0819082b2b19ull) \
    X(0x082b081919082b08ull) X(0x082b082b08080808ull) X(0x082b082b0808082bull) X(0x082b190808080819ull) \
    X(0x082b190808081908ull) X(0x082b190808190808ull) X(0x082b190819080808ull) X(0x082b19081919192bull) \
    X(0x082b191908080808ull) X(0x082b191919080819ull) X(0x082b1919192b1908ull) X(0x082b192b2b190808ull) \
    X(0x082b2b0808082b08ull) X(0x082b2b08082b0808ull) X(0x082b2b082b191908ull) X(0x082b2b2b19081908ull) \
    X(0x1908080808080819ull) X(0x1908080808081908ull) X(0x1908080808190808ull) X(0x1908080808192b08ull) \
    X(0x19080808082b0819ull) X(0x19080808082b1908ull) X(0x1908080819080808ull) X(0x1908080819082b08ull) \
    X(0x190808081919192bull) X(0x19080808192b0808ull) X(0x190808082b080819ull) X(0x190808082b081908ull) \
    X(0x190808082b190808ull) X(0x1908081908080808ull) X(0x19080819082b0808ull) X(0x19080819192b0819ull) \
    X(0x190808192b080808ull) X(0x190808192b081919ull) X(0x1908082b08080819ull) X(0x1908082b08190808ull) \
    X(0x1908082b19082b08ull) X(0x1908082b1919192bull) X(0x1908082b192b2b08ull) X(0x1908190808080808ull) \
    X(0x1908190808082b08ull) X(0x19081908082b0808ull) X(0x190819082b080808ull) X(0x190819082b192b19ull) \
    X(0x190819190819082bull) X(0x19081919082b1908ull) X(0x1908192b08080808ull) X(0x19082b0808080819ull) \
    X(0x19082b0808081908ull) X(0x19082b0808190808ull) X(0x19082b0819080808ull) X(0x19082b0819081919ull) \
    X(0x19082b1908080808ull) X(0x19082b1919192b08ull) X(0x19082b19192b0819ull) X(0x19082b192b08082bull) \
    X(0x19082b2b19081919ull) X(0x19082b2b2b190808ull) X(0x1919080808080808ull) X(0x1919080808082b08ull) \
    X(0x1919080808190819ull) X(0x1919080808192b19ull) X(0x19190808082b0808ull) X(0x191908082b080808ull) \
    X(0x191908082b082b08ull) X(0x1919081908081908ull) X(0x191908191908082bull) X(0x191908192b2b1908ull) \
    X(0x1919082b2b190819ull) X(0x191919082b190808ull) X(0x191919082b19082bull) X(0x1919191908082b2bull) \
    X(0x1919192b08080819ull) X(0x1919192b19191908ull) X(0x19192b0808080808ull) X(0x19192b0808190819ull) \
    X(0x19192b0808192b19ull) X(0x19192b08192b1908ull) X(0x19192b1919080808ull) X(0x19192b2b08082b08ull) \
    X(0x192b080808081908ull) X(0x192b080808190808ull) X(0x192b080819080808ull) X(0x192b0808192b2b08ull) \
    X(0x192b081908080808ull) X(0x192b081919191919ull) X(0x192b082b08192b08ull) X(0x192b082b192b0808ull) \
    X(0x192b190808080808ull) X(0x192b190808081919ull) X(0x192b191908190808ull) X(0x192b19190819082bull) \
    X(0x192b19192b081908ull) X(0x192b2b081908082bull) X(0x2b08080808080808ull) X(0x2b0808080808082bull) \
    X(0x2b08080808082b2bull) X(0x2b08080819080819ull) X(0x2b0808082b08082bull) X(0x2b08081908081908ull) \
    X(0x2b08081908192b08ull) X(0x2b08081919080808ull) X(0x2b08082b08190819ull) X(0x2b08190808080819ull) \
    X(0x2b08190808081908ull) X(0x2b08190808190808ull) X(0x2b08190808191919ull) X(0x2b08190819080808ull) \
    X(0x2b081908192b0808ull) X(0x2b08191908080808ull) X(0x2b0819191908192bull) X(0x2b0819192b191908ull) \
    X(0x2b08192b08082b19ull) X(0x2b08192b19080808ull) X(0x2b08192b192b0808ull) X(0x2b082b080808082bull) \
    X(0x2b082b1908081908ull) X(0x2b082b2b08190819ull) X(0x2b19080808081908ull) X(0x2b19080808190808ull) \
    X(0x2b190808082b1908ull) X(0x2b19080819080808ull) X(0x2b1908082b2b0819ull) X(0x2b1908190819192bull) \
    X(0x2b1908192b080808ull) X(0x2b19082b19081919ull) X(0x2b19190808080808ull) X(0x2b191908082b082bull) \
    X(0x2b19190819081908ull) X(0x2b19191919190819ull) X(0x2b192b082b080819ull) X(0x2b192b19082b0808ull) \
    X(0x2b2b08080808082bull) X(0x2b2b080819190808ull) X(0x2b2b08082b081919ull) X(0x2b2b081908082b19ull) \
    X(0x2b2b082b08080808ull) X(0x2b2b190808192b08ull) X(0x2b2b2b0819190808ull) X(0x2b2b2b1908081908ull) \

#define IQ2XXS_U64(v) v,
static const uint64_t iq2xxs_grid[256] = {IQ2XXS_GRID(IQ2XXS_U64)};

/* iq2xxs_signs[s7]: byte j = 0xff where weight j of a group with stored sign bits s7 is
 * negative (bits 0..6 = s7, bit 7 = the parity of s7), 0 elsewhere: the signs are then
 * applied in the byte domain as (g ^ m) - m, 8 weights at a time without a per-bit loop. */
#define IQ2XXS_SIGNS(X) \
    X(0x0000000000000000ull) X(0xff000000000000ffull) X(0xff0000000000ff00ull) X(0x000000000000ffffull) \
    X(0xff00000000ff0000ull) X(0x0000000000ff00ffull) X(0x0000000000ffff00ull) X(0xff00000000ffffffull) \
    X(0xff000000ff000000ull) X(0x00000000ff0000ffull) X(0x00000000ff00ff00ull) X(0xff000000ff00ffffull) \
    X(0x00000000ffff0000ull) X(0xff000000ffff00ffull) X(0xff000000ffffff00ull) X(0x00000000ffffffffull) \
    X(0xff0000ff00000000ull) X(0x000000ff000000ffull) X(0x000000ff0000ff00ull) X(0xff0000ff0000ffffull) \
    X(0x000000ff00ff0000ull) X(0xff0000ff00ff00ffull) X(0xff0000ff00ffff00ull) X(0x000000ff00ffffffull) \
    X(0x000000ffff000000ull) X(0xff0000ffff0000ffull) X(0xff0000ffff00ff00ull) X(0x000000ffff00ffffull) \
    X(0xff0000ffffff0000ull) X(0x000000ffffff00ffull) X(0x000000ffffffff00ull) X(0xff0000ffffffffffull) \
    X(0xff00ff0000000000ull) X(0x0000ff00000000ffull) X(0x0000ff000000ff00ull) X(0xff00ff000000ffffull) \
    X(0x0000ff0000ff0000ull) X(0xff00ff0000ff00ffull) X(0xff00ff0000ffff00ull) X(0x0000ff0000ffffffull) \
    X(0x0000ff00ff000000ull) X(0xff00ff00ff0000ffull) X(0xff00ff00ff00ff00ull) X(0x0000ff00ff00ffffull) \
    X(0xff00ff00ffff0000ull) X(0x0000ff00ffff00ffull) X(0x0000ff00ffffff00ull) X(0xff00ff00ffffffffull) \
    X(0x0000ffff00000000ull) X(0xff00ffff000000ffull) X(0xff00ffff0000ff00ull) X(0x0000ffff0000ffffull) \
    X(0xff00ffff00ff0000ull) X(0x0000ffff00ff00ffull) X(0x0000ffff00ffff00ull) X(0xff00ffff00ffffffull) \
    X(0xff00ffffff000000ull) X(0x0000ffffff0000ffull) X(0x0000ffffff00ff00ull) X(0xff00ffffff00ffffull) \
    X(0x0000ffffffff0000ull) X(0xff00ffffffff00ffull) X(0xff00ffffffffff00ull) X(0x0000ffffffffffffull) \
    X(0xffff000000000000ull) X(0x00ff0000000000ffull) X(0x00ff00000000ff00ull) X(0xffff00000000ffffull) \
    X(0x00ff000000ff0000ull) X(0xffff000000ff00ffull) X(0xffff000000ffff00ull) X(0x00ff000000ffffffull) \
    X(0x00ff0000ff000000ull) X(0xffff0000ff0000ffull) X(0xffff0000ff00ff00ull) X(0x00ff0000ff00ffffull) \
    X(0xffff0000ffff0000ull) X(0x00ff0000ffff00ffull) X(0x00ff0000ffffff00ull) X(0xffff0000ffffffffull) \
    X(0x00ff00ff00000000ull) X(0xffff00ff000000ffull) X(0xffff00ff0000ff00ull) X(0x00ff00ff0000ffffull) \
    X(0xffff00ff00ff0000ull) X(0x00ff00ff00ff00ffull) X(0x00ff00ff00ffff00ull) X(0xffff00ff00ffffffull) \
    X(0xffff00ffff000000ull) X(0x00ff00ffff0000ffull) X(0x00ff00ffff00ff00ull) X(0xffff00ffff00ffffull) \
    X(0x00ff00ffffff0000ull) X(0xffff00ffffff00ffull) X(0xffff00ffffffff00ull) X(0x00ff00ffffffffffull) \
    X(0x00ffff0000000000ull) X(0xffffff00000000ffull) X(0xffffff000000ff00ull) X(0x00ffff000000ffffull) \
    X(0xffffff0000ff0000ull) X(0x00ffff0000ff00ffull) X(0x00ffff0000ffff00ull) X(0xffffff0000ffffffull) \
    X(0xffffff00ff000000ull) X(0x00ffff00ff0000ffull) X(0x00ffff00ff00ff00ull) X(0xffffff00ff00ffffull) \
    X(0x00ffff00ffff0000ull) X(0xffffff00ffff00ffull) X(0xffffff00ffffff00ull) X(0x00ffff00ffffffffull) \
    X(0xffffffff00000000ull) X(0x00ffffff000000ffull) X(0x00ffffff0000ff00ull) X(0xffffffff0000ffffull) \
    X(0x00ffffff00ff0000ull) X(0xffffffff00ff00ffull) X(0xffffffff00ffff00ull) X(0x00ffffff00ffffffull) \
    X(0x00ffffffff000000ull) X(0xffffffffff0000ffull) X(0xffffffffff00ff00ull) X(0x00ffffffff00ffffull) \
    X(0xffffffffffff0000ull) X(0x00ffffffffff00ffull) X(0x00ffffffffffff00ull) X(0xffffffffffffffffull) \

static const uint64_t iq2xxs_signs[128] = {IQ2XXS_SIGNS(IQ2XXS_U64)};

/* The 32 weights of sub-block ib of the IQ2_XXS block at p as signed bytes (quants 0..15
 * in lo, 16..31 in hi) and its scale: weight = db * byte, the same product as gguf's
 * (db * magnitude) * sign since rounding is symmetric in the sign. */
static inline void iq2xxs_quants(const uint8_t *p, int ib, vb *lo, vb *hi, float *db) {
    uint32_t a0, a1;
    memcpy(&a0, p + 2 + 8 * ib, 4);
    memcpy(&a1, p + 6 + 8 * ib, 4);
    *db = h2f(p) * (0.5f + (float)(a1 >> 28)) * 0.25f;
#if DS4K_ISA >= 1
    const __m256i g = _mm256_setr_epi64x((long long)iq2xxs_grid[a0 & 255], (long long)iq2xxs_grid[(a0 >> 8) & 255],
                                         (long long)iq2xxs_grid[(a0 >> 16) & 255], (long long)iq2xxs_grid[a0 >> 24]);
    const __m256i m = _mm256_setr_epi64x((long long)iq2xxs_signs[a1 & 127], (long long)iq2xxs_signs[(a1 >> 7) & 127],
                                         (long long)iq2xxs_signs[(a1 >> 14) & 127], (long long)iq2xxs_signs[(a1 >> 21) & 127]);
    const __m256i v = _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
    *lo = _mm256_castsi256_si128(v), *hi = _mm256_extracti128_si256(v, 1);
#else
    for (int l = 0; l < 4; l++) {
        const uint64_t g = iq2xxs_grid[(a0 >> (8 * l)) & 255], m = iq2xxs_signs[(a1 >> (7 * l)) & 127];
        uint8_t *dst = l < 2 ? lo->b + 8 * l : hi->b + 8 * (l - 2);
        for (int j = 0; j < 8; j++) {
            const uint8_t gj = (uint8_t)(g >> (8 * j)), mj = (uint8_t)(m >> (8 * j));
            dst[j] = (uint8_t)((gj ^ mj) - mj);
        }
    }
#endif
}

/* The 6-bit scale and min of sub-block i of a Q4_K/Q5_K block (GGML's get_scale_min_k4). */
static inline void k4_scale_min(const uint8_t *s, int i, uint8_t *sc, uint8_t *mn) {
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (uint8_t)((s[i + 4] & 15) | ((s[i - 4] >> 6) << 4));
        *mn = (uint8_t)((s[i + 4] >> 4) | ((s[i] >> 6) << 4));
    }
}

static inline void dq_store(float *p, vf v) {
#if DS4K_ISA >= 2
    _mm512_storeu_ps(p, v);
#elif DS4K_ISA == 1
    _mm256_storeu_ps(p, v.a), _mm256_storeu_ps(p + 8, v.b);
#else
    memcpy(p, v.v, sizeof v.v);
#endif
}

/* out = d * q (+ m) for 16 quants: one multiply and one add, rounded apart, as numpy does. */
static inline void dq_put(float *out, vf q, float d, int has_m, float m) {
    vf w = vf_mul(vf_set1(d), q);
    dq_store(out, has_m ? vf_add(w, vf_set1(m)) : w);
}

/* The block types 16 quants at a time (simd.h), the same operations as the scalar loops of
 * dequant_row below, so the same bits; 0 for a type it leaves to them. */
static int dequant_row_vec(int type, const uint8_t *p, int64_t cols, float *out) {
    const int qk = ds4k_block_weights(type), bs = ds4k_block_bytes(type);
    switch (type) {
    case DS4K_Q4_0: case DS4K_Q4_1: case DS4K_Q5_0: case DS4K_Q5_1: case DS4K_Q8_0:
    case DS4K_Q4_K: case DS4K_Q5_K: case DS4K_Q6_K: case DS4K_Q2_K: case DS4K_IQ2_XXS: break;
    default: return 0;
    }
    for (int64_t b = 0; b < cols / qk; b++, p += bs, out += qk) {
        switch (type) {
        case DS4K_Q4_0: {
            vb v = vb_load(p + 2);
            const float d = h2f(p);
            dq_put(out, vf_i8(vb_sub(vb_lo4(v), 8)), d, 0, 0.0f);
            dq_put(out + 16, vf_i8(vb_sub(vb_hi4(v), 8)), d, 0, 0.0f);
            break;
        }
        case DS4K_Q4_1: {
            vb v = vb_load(p + 4);
            const float d = h2f(p), m = h2f(p + 2);
            dq_put(out, vf_u8(vb_lo4(v)), d, 1, m);
            dq_put(out + 16, vf_u8(vb_hi4(v)), d, 1, m);
            break;
        }
        case DS4K_Q5_0: case DS4K_Q5_1: {
            const int has_m = type == DS4K_Q5_1, off = has_m ? 4 : 2;
            const float d = h2f(p), m = has_m ? h2f(p + 2) : 0.0f;
            uint32_t qh;
            memcpy(&qh, p + off, 4);
            vb v = vb_load(p + off + 4), h0, h1;
            vb_from_bits32(qh, &h0, &h1);
            vb lo = vb_or(vb_lo4(v), h0), hi = vb_or(vb_hi4(v), h1);
            if (has_m) {
                dq_put(out, vf_u8(lo), d, 1, m);
                dq_put(out + 16, vf_u8(hi), d, 1, m);
            } else {
                dq_put(out, vf_i8(vb_sub(lo, 16)), d, 0, 0.0f);
                dq_put(out + 16, vf_i8(vb_sub(hi, 16)), d, 0, 0.0f);
            }
            break;
        }
        case DS4K_Q8_0: {
            const float d = h2f(p);
            dq_put(out, vf_i8_mem(p + 2), d, 0, 0.0f);
            dq_put(out + 16, vf_i8_mem(p + 18), d, 0, 0.0f);
            break;
        }
        case DS4K_Q4_K: case DS4K_Q5_K: {
            const int five = type == DS4K_Q5_K;
            const float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc12 = p + 4, *qs = p + (five ? 48 : 16);
            vb h0 = vb_load(p + 16), h1 = vb_load(p + 32);
            for (int i = 0; i < 8; i++) {
                uint8_t sc, mn;
                k4_scale_min(sc12, i, &sc, &mn);
                /* ds q - dm is ds q + (-dm) exactly */
                const float ds = d * (float)sc, ndm = -(dmin * (float)mn);
                const uint8_t *q = qs + 32 * (i / 2);
                vb a = vb_load(q), c = vb_load(q + 16);
                a = i & 1 ? vb_hi4(a) : vb_lo4(a);
                c = i & 1 ? vb_hi4(c) : vb_lo4(c);
                if (five) a = vb_or(a, vb_bits_hi(h0, i, 1)), c = vb_or(c, vb_bits_hi(h1, i, 1));
                dq_put(out + 32 * i, vf_u8(a), ds, 1, ndm);
                dq_put(out + 32 * i + 16, vf_u8(c), ds, 1, ndm);
            }
            break;
        }
        case DS4K_Q6_K: {
            const int8_t *sc = (const int8_t *)(p + 192);
            const float d = h2f(p + 208);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
                for (int s = 0; s < 4; s++)
                    for (int half = 0; half < 2; half++) {
                        vb lo = vb_load(ql + 32 * (s & 1) + 16 * half);
                        lo = s >= 2 ? vb_hi4(lo) : vb_lo4(lo);
                        vb v = vb_sub(vb_or(lo, vb_bits_hi(vb_load(qh + 16 * half), 2 * s, 3)), 32);
                        const int e = 128 * h + 32 * s + 16 * half;
                        dq_put(out + e, vf_i8(v), d * (float)sc[e / 16], 0, 0.0f);
                    }
            }
            break;
        }
        case DS4K_Q2_K: {
            const float d = h2f(p + 80), dmin = h2f(p + 82);
            for (int h = 0; h < 2; h++)
                for (int half = 0; half < 2; half++) {
                    const vb v = vb_load(p + 16 + 32 * h + 16 * half);
                    for (int s = 0; s < 4; s++) {
                        const int e = 128 * h + 32 * s + 16 * half;
                        const uint8_t sc = p[e / 16];
                        dq_put(out + e, vf_u8(vb_bits(v, 2 * s, 3)), d * (float)(sc & 15), 1, -(dmin * (float)(sc >> 4)));
                    }
                }
            break;
        }
        case DS4K_IQ2_XXS:
            for (int ib = 0; ib < 8; ib++) {
                vb lo, hi;
                float db;
                iq2xxs_quants(p, ib, &lo, &hi, &db);
                dq_put(out + 32 * ib, vf_i8(lo), db, 0, 0.0f);
                dq_put(out + 32 * ib + 16, vf_i8(hi), db, 0, 0.0f);
            }
            break;
        default: break;
        }
    }
    return 1;
}

static void dequant_row(int type, const uint8_t *p, int64_t cols, float *out) {
    switch (type) {
    case DS4K_F32: memcpy(out, p, (size_t)cols * 4); return;
    case DS4K_F16:
        for (int64_t c = 0; c < cols; c++) out[c] = h2f(p + 2 * c);
        return;
    case DS4K_BF16:
        for (int64_t c = 0; c < cols; c++) out[c] = ds4k_bf16_to_f32(ds4k_rd16(p + 2 * c));
        return;
    default: break;
    }
    if (dequant_row_vec(type, p, cols, out)) return;
    const int qk = ds4k_block_weights(type), bs = ds4k_block_bytes(type);
    for (int64_t b = 0; b < cols / qk; b++, p += bs, out += qk) {
        switch (type) {
        case DS4K_Q4_0: {
            float d = h2f(p);
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)((p[2 + j] & 15) - 8);
                out[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
            break;
        }
        case DS4K_Q4_1: {
            float d = h2f(p), m = h2f(p + 2);
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)(p[4 + j] & 15) + m;
                out[j + 16] = d * (float)(p[4 + j] >> 4) + m;
            }
            break;
        }
        case DS4K_Q5_0: case DS4K_Q5_1: {
            const int has_m = type == DS4K_Q5_1, off = has_m ? 4 : 2;
            float d = h2f(p), m = has_m ? h2f(p + 2) : 0.0f;
            uint32_t qh;
            memcpy(&qh, p + off, 4);
            const uint8_t *qs = p + off + 4;
            for (int j = 0; j < 16; j++) {
                int lo = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
                int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                if (has_m) {
                    out[j] = d * (float)lo + m;
                    out[j + 16] = d * (float)hi + m;
                } else {
                    out[j] = d * (float)(lo - 16);
                    out[j + 16] = d * (float)(hi - 16);
                }
            }
            break;
        }
        case DS4K_Q8_0: {
            float d = h2f(p);
            for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)p[2 + j] * d;
            break;
        }
        case DS4K_Q4_K: case DS4K_Q5_K: {
            const int five = type == DS4K_Q5_K;
            float d = h2f(p), dmin = h2f(p + 2);
            const uint8_t *sc12 = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
            for (int i = 0; i < 8; i++) {
                uint8_t sc, mn;
                k4_scale_min(sc12, i, &sc, &mn);
                float ds = d * (float)sc, dm = dmin * (float)mn;
                const uint8_t *q = qs + 32 * (i / 2);
                for (int l = 0; l < 32; l++) {
                    int v = i & 1 ? q[l] >> 4 : q[l] & 15;
                    if (five) v |= ((qh[l] >> i) & 1) << 4;
                    out[32 * i + l] = ds * (float)v - dm;
                }
            }
            break;
        }
        case DS4K_Q6_K: {
            const uint8_t *ql = p, *qh = p + 128;
            const int8_t *sc = (const int8_t *)(p + 192);
            float d = h2f(p + 208);
            for (int e = 0; e < 256; e++) {
                int h = e / 128, s = (e / 32) % 4, l = e % 32;
                uint8_t lo = ql[64 * h + 32 * (s & 1) + l];
                int v = (s >= 2 ? lo >> 4 : lo & 15) | (((qh[32 * h + l] >> (2 * s)) & 3) << 4);
                out[e] = (d * (float)sc[e / 16]) * (float)(v - 32);
            }
            break;
        }
        case DS4K_Q2_K: {
            const float d = h2f(p + 80), dmin = h2f(p + 82);
            for (int e = 0; e < 256; e++) {
                const int q = (p[16 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
                const uint8_t sc = p[e / 16];
                out[e] = (d * (float)(sc & 15)) * (float)q - dmin * (float)(sc >> 4);
            }
            break;
        }
        case DS4K_IQ2_XXS: {
            const float d = h2f(p);
            for (int ib = 0; ib < 8; ib++) {
                uint32_t a0, a1;
                memcpy(&a0, p + 2 + 8 * ib, 4);
                memcpy(&a1, p + 6 + 8 * ib, 4);
                const float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
                for (int l = 0; l < 4; l++) {
                    const uint32_t s7 = (a1 >> (7 * l)) & 127, signs = s7 | (uint32_t)__builtin_parity(s7) << 7;
                    const uint64_t g = iq2xxs_grid[(a0 >> (8 * l)) & 255];
                    for (int j = 0; j < 8; j++) {
                        const float w = db * (float)((g >> (8 * j)) & 255);
                        out[32 * ib + 8 * l + j] = (signs >> j) & 1 ? -w : w;
                    }
                }
            }
            break;
        }
        default: break;
        }
    }
}

/* out[rows, cols] = the weights of `rows` rows of `type`; 0, or -1 for a bad type/shape. */
static int dequant(int type, const void *w, float *out, int64_t rows, int64_t cols) {
    int64_t rb = ds4k_row_bytes(type, cols);
    if (rb == 0 || rows < 0) return -1;
    for (int64_t r = 0; r < rows; r++) dequant_row(type, (const uint8_t *)w + r * rb, cols, out + r * cols);
    return 0;
}

#if DS4K_ISA >= 2
/* The 16 x 16 transpose of r[16] in registers: r[i] lane j becomes r[j] lane i. Pairs of
 * rows interleaved, then pairs of pairs, then the 128-bit quarters (64 shuffles). */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + e], quarter q: column 4q + e of rows 4g .. 4g + 3 */
    __m512 u[16];
    for (int g = 0; g < 4; g++) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int e = 0; e < 4; e++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x44), v1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xee);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xee);
        r[e] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + e] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        r[8 + e] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + e] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}
#elif DS4K_ISA == 1
/* The 8 x 8 transpose of r[8] (AVX2): pairs of rows interleaved, pairs of pairs, then the
 * 128-bit halves (24 shuffles). */
static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 2; g++) { /* u[4g + e], half q: column 4q + e of rows 4g .. 4g + 3 */
        u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
    }
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}
#endif

#if DS4K_ISA >= 2
/* Q4_1 for qgemm.c's short fused tiles (q4_1_bytes32), with no float scratch and no float
 * transposes. For each 16-row half of a 32-row chunk and each block, the 16 rows' quant
 * bytes are loaded four rows to a register and regrouped by 32-bit word (four two-source
 * permutes and four 128-bit shuffles: word g of every row, one row per lane), so that byte
 * k of word g holds, in every lane, columns 4g + k (low nibble) and 4g + k + 16 (high
 * nibble) of that lane's row; d and m come one row per lane from a gather. */

/* The quant words of the block `off` bytes into each row, for 16 rows: word[g] lane i =
 * bytes 4g .. 4g + 3 of row i's quants. */
static inline __attribute__((always_inline)) void q4_1_words16(const uint8_t *const row[16], int64_t off, __m512i word[4]) {
    const __m512i a_idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i b_idx = _mm512_add_epi32(a_idx, _mm512_set1_epi32(2));
    __m512i z[4]; /* z[k]: rows 4k .. 4k + 3, one per 128-bit lane */
    for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row[4 * k] + off + 4)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row[4 * k + 1] + off + 4)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row[4 * k + 2] + off + 4)), 2);
        z[k] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row[4 * k + 3] + off + 4)), 3);
    }
    /* words 0|1 and 2|3 of rows 0-7 (from z0, z1) and of rows 8-15 (z2, z3) */
    const __m512i a = _mm512_permutex2var_epi32(z[0], a_idx, z[1]), bb = _mm512_permutex2var_epi32(z[0], b_idx, z[1]);
    const __m512i c = _mm512_permutex2var_epi32(z[2], a_idx, z[3]), d = _mm512_permutex2var_epi32(z[2], b_idx, z[3]);
    word[0] = _mm512_shuffle_i64x2(a, c, 0x44), word[1] = _mm512_shuffle_i64x2(a, c, 0xee);
    word[2] = _mm512_shuffle_i64x2(bb, d, 0x44), word[3] = _mm512_shuffle_i64x2(bb, d, 0xee);
}

/* A block of 32 rows as qgemm.c's fused tiles read it: for each 16-row half, column c's 16
 * quants as bytes at q[half][c] (one byte per row), and d, m per row (0 for rows past the
 * chunk's end, whose weights are then 0). Bytes, not floats: storing a dequantized column is
 * a 512-bit store, and those (about two per ns here) were most of what a separate
 * dequantization pass cost. */
typedef struct {
    uint8_t q[2][32][16];
    __m512 d[2], m[2];
} q4_1_bytes;

/* The nb blocks of the nr (<= 32) rows at w (rb bytes apart) into out[0 .. nb - 1]. */
static void q4_1_bytes32(const uint8_t *w, int64_t rb, int nr, int64_t nb, q4_1_bytes *out) {
    /* per 128-bit lane: byte 4k + i <- byte 4i + k (a 4 x 4 byte transpose), then dword
     * 4k + l <- dword 4l + k: 128-bit lane k = column k of all 16 rows */
    const __m512i bsel = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    const __m512i dsel = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i nib = _mm512_set1_epi8(15);
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    for (int h = 0; h < 2; h++) {
        const int live = nr - 16 * h <= 0 ? 0 : nr - 16 * h >= 16 ? 16 : nr - 16 * h; /* rows of this half */
        const __mmask16 have = (__mmask16)((1u << live) - 1);
        const uint8_t *row[16]; /* rows past nr read row 0's bytes (valid memory) */
        for (int i = 0; i < 16; i++) row[i] = w + (i < live ? (int64_t)(16 * h + i) * rb : 0);
        for (int64_t b = 0; b < nb; b++) {
            __m512i word[4];
            q4_1_words16(row, b * 20, word);
            for (int g = 0; g < 4; g++) {
                const __m512i lo = _mm512_and_si512(word[g], nib), hi = _mm512_and_si512(_mm512_srli_epi32(word[g], 4), nib);
                _mm512_storeu_si512(out[b].q[h][4 * g], _mm512_permutexvar_epi32(dsel, _mm512_shuffle_epi8(lo, bsel)));
                _mm512_storeu_si512(out[b].q[h][16 + 4 * g], _mm512_permutexvar_epi32(dsel, _mm512_shuffle_epi8(hi, bsel)));
            }
            const __m512i hdr = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), have, offs, w + 16 * h * rb + b * 20, 1);
            out[b].d[h] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
            out[b].m[h] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)));
        }
    }
}

/* Column c of half h of a q4_1_bytes block: the 16 rows' weights, dequant_row's bits. q comes
 * to float exactly as (2^23 + q) - 2^23 (integer and add operations, off the FMA pipes).
 * d q is exact in float32 (d has an 11-bit significand, q < 16), so the fused d q + m rounds
 * once, exactly as the multiply and then the add do. */
static inline __attribute__((always_inline)) __m512 q4_1_bytes_col16(const q4_1_bytes *q, int h, int c) {
    const __m512i u = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q->q[h][c]));
    const __m512 v = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_or_si512(u, _mm512_set1_epi32(0x4B000000))),
                                   _mm512_set1_ps(8388608.0f));
    return _mm512_fmadd_ps(v, q->d[h], q->m[h]);
}
#endif

#if DS4K_ISA >= 1
#define DQT_STEP 256 /* columns dequantized per pass: a multiple of every type's block */

/* out[c][32] = the weight of row r at column c, for the nr (<= 32) rows at w (rb bytes
 * apart) and cols columns (a multiple of 8); rows nr..31 are 0. This is qgemm.c's long-
 * product layout. Rows are dequantized 256 columns at a time by dequant_row (so the values
 * are its bits) into a 32 KB scratch, then transposed in registers (16 x 16 with AVX-512,
 * 8 x 8 with AVX2): a column scattered element by element into a 128-byte-strided tile cost
 * more than the dequantization. */
static void dequant_rows_t32(int type, const uint8_t *w, int64_t rb, int nr, int64_t cols, float *out) {
    float tmp[32 * DQT_STEP] __attribute__((aligned(64)));
    /* The rows are one contiguous run of blocks, read below in 32 short pieces per pass:
     * requested all at once their misses overlap (one by one they stalled each pass). */
    for (int64_t off = 0; off < nr * rb; off += 64) _mm_prefetch((const char *)w + off, _MM_HINT_T0);
    if (nr < 32) memset(tmp + nr * DQT_STEP, 0, sizeof(float) * (size_t)((32 - nr) * DQT_STEP));
    for (int64_t c0 = 0; c0 < cols; c0 += DQT_STEP) {
        const int64_t len = cols - c0 < DQT_STEP ? cols - c0 : DQT_STEP;
        const int64_t off = c0 ? ds4k_row_bytes(type, c0) : 0; /* c0 is a whole number of blocks */
        for (int r = 0; r < nr; r++) dequant_row(type, w + r * rb + off, len, tmp + r * DQT_STEP);
#if DS4K_ISA >= 2
        for (int64_t j0 = 0; j0 < len; j0 += 16) {
            const int nj = len - j0 < 16 ? (int)(len - j0) : 16;
            const __mmask16 k = (__mmask16)((1u << nj) - 1);
            for (int h = 0; h < 32; h += 16) {
                __m512 v[16];
                for (int i = 0; i < 16; i++) v[i] = _mm512_maskz_loadu_ps(k, tmp + (h + i) * DQT_STEP + j0);
                transpose16(v);
                for (int j = 0; j < nj; j++) _mm512_storeu_ps(out + (c0 + j0 + j) * 32 + h, v[j]);
            }
        }
#else
        for (int64_t j0 = 0; j0 < len; j0 += 8) /* len is a multiple of 8 */
            for (int h = 0; h < 32; h += 8) {
                __m256 v[8];
                for (int i = 0; i < 8; i++) v[i] = _mm256_loadu_ps(tmp + (h + i) * DQT_STEP + j0);
                transpose8(v);
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(out + (c0 + j0 + j) * 32 + h, v[j]);
            }
#endif
    }
}
#endif
