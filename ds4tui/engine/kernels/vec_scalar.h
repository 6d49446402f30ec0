/* vec_scalar.h: the portable build (DS4K_ISA 0) has no vector parts: every loop is its shared
 * scalar tail from the start.
 */
#ifndef DS4K_VEC_SCALAR_H
#define DS4K_VEC_SCALAR_H

static inline int dot_vec(const float *a, const float *b, int n, float *s) {
    (void)a, (void)b, (void)n;
    *s = 0.0f;
    return 0;
}
static inline int exp_shift_sum_vec(float *p, int n, float m, float *s) {
    (void)p, (void)n, (void)m;
    *s = 0.0f;
    return 0;
}
static inline int axpy_vec(float *y, float a, const float *x, int n) { (void)y, (void)a, (void)x, (void)n; return 0; }
static inline int scores_vec(float *s, const float *q, const float *k, int nt, int d) {
    (void)s, (void)q, (void)k, (void)nt, (void)d;
    return 0;
}
static inline int weighted_sum_vec(float *out, const float *p, const float *v, int nt, int d) {
    (void)out, (void)p, (void)v, (void)nt, (void)d;
    return 0;
}
static inline int max_of_vec(const float *p, int n, float *m) {
    (void)p, (void)n;
    *m = -INFINITY;
    return 0;
}
static inline int64_t f16_to_f32_vec(float *dst, const uint16_t *src, int64_t n) { (void)dst, (void)src, (void)n; return 0; }
static inline int f32_to_f16_vec(uint16_t *dst, const float *src, int n) { (void)dst, (void)src, (void)n; return 0; }
static inline int swiglu_vec(float *a, const float *g, const float *u, int n) { (void)a, (void)g, (void)u, (void)n; return 0; }
static inline int geglu_vec(float *a, const float *g, const float *u, int n, float c, float c3) {
    (void)a, (void)g, (void)u, (void)n, (void)c, (void)c3;
    return 0;
}
static inline int64_t softcap_vec(float *x, int64_t n, float cap, float inv) {
    (void)x, (void)n, (void)cap, (void)inv;
    return 0;
}
static inline int weighted_sums_vec(float *const *out, int off, float (*p)[ATT_BLOCK_MAX], const void *v, int f16, int nt,
                                    int d, int G, int pf) {
    (void)out, (void)off, (void)p, (void)v, (void)f16, (void)nt, (void)d, (void)G, (void)pf;
    return 0;
}
static inline int finite16_vec(const uint16_t *h, int64_t n, int64_t *at) { (void)h, (void)n; *at = 0; return 1; }
static inline int finite32_vec(const uint32_t *f, int64_t n, int64_t *at) { (void)f, (void)n; *at = 0; return 1; }

#endif
