/* The element-wise parts of a sampler decode step, one call each per layer (see decode_kernel.py).
 *
 * A decode step of a few rows is hundreds of tiny torch calls of a few microseconds each; here the RMSNorms, the
 * q/k norms, the rotary embedding, the K/V cache write and the attention over the cache of one layer are a handful
 * of plain loops. The matmuls stay torch's (oneDNN). All arithmetic is fp32 and, like torch's kernels, rounds
 * every product and sum on its own (built with -ffp-contract=off: no fused multiply-adds), so results differ from
 * the torch path only in the order of the sums (dot products, softmax normaliser): fp32 rounding.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* One binary for any x86-64 CPU: the loader picks the widest vector unit this CPU has. */
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))
/* Independent partial sums: the compiler vectorises them without reassociating any one sum. */
#define LANES 16

INLINE float dot(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    float total = 0.0f;
    for (int j = 0; j < LANES; j++) total += acc[j];
    for (; i < n; i++) total += a[i] * b[i];
    return total;
}

/* out = x * rsqrt(mean(x^2) + eps) * w (w may be NULL); out may be x. */
INLINE void norm_row(const float *x, const float *w, float *out, int64_t d, float eps) {
    float rstd = 1.0f / sqrtf(dot(x, x, d) / (float)d + eps);
    if (w)
        for (int64_t i = 0; i < d; i++) out[i] = (x[i] * rstd) * w[i];
    else
        for (int64_t i = 0; i < d; i++) out[i] = x[i] * rstd;
}

/* h += delta (when given), then out = RMSNorm(h) * w, for rows x d. */
CLONES void tc_add_rms_norm(float *h, const float *delta, const float *w, float *out, int64_t rows, int64_t d,
                            float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *hr = h + r * d;
        if (delta) {
            const float *dr = delta + r * d;
            for (int64_t i = 0; i < d; i++) hr[i] += dr[i];
        }
        norm_row(hr, w, out + r * d, d, eps);
    }
}

/* out = silu(gate) * up, where each row of gate_up is [gate (inter) | up (inter)]. */
CLONES void tc_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t inter) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        for (int64_t i = 0; i < inter; i++) o[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
    }
}

/* Rotate one head x [hd] in place: x * cos + roll(x, hd/2) * sin, with cos/sin scaled by `scale` first (the
 * signed-sin table has rotate_half's sign folded into its first half, as in sampler_model). */
INLINE void rope_head(float *x, const float *cos_row, const float *sin_row, int64_t hd, float scale, float *tmp) {
    int64_t half = hd / 2;
    memcpy(tmp, x, (size_t)hd * sizeof(float));
    for (int64_t i = 0; i < half; i++) x[i] = tmp[i] * (cos_row[i] * scale) + tmp[i + half] * (sin_row[i] * scale);
    for (int64_t i = half; i < hd; i++)
        x[i] = tmp[i] * (cos_row[i] * scale) + tmp[i - half] * (sin_row[i] * scale);
}

/* Attention inputs, cache write and attention of one layer for `rows` sequences, sequence r in cache slot r.
 *
 * qkv [rows, (nh + 2 nkv) * hd] (modified in place): q/k norms (qk_norm [nh + nkv, hd] or NULL), rotary embedding
 * at rope_pos[r] (tables [positions, hd]; queries also scaled by q_scale), then K/V written at local[r] of slot r
 * (k_cache/v_cache: this layer's K and V with the given element strides; the head dim is contiguous). Sequence r
 * attends to its prompt's first p_len[r] positions of prompt slot p_slot[r] (prompt_k/prompt_v NULL: no prompt
 * part) and then to its own positions 0..local[r]; out [rows, nh * hd]; scores: room for the longest row.
 */
CLONES void tc_attend(float *qkv, int64_t rows, int64_t nh, int64_t nkv, int64_t hd, const float *qk_norm, float eps,
                      const float *cos_table, const float *sin_table, const int64_t *rope_pos, float q_scale,
                      float *k_cache, float *v_cache, int64_t slot_stride, int64_t head_stride, int64_t pos_stride,
                      const int64_t *local, const float *prompt_k, const float *prompt_v, int64_t p_slot_stride,
                      int64_t p_head_stride, int64_t p_pos_stride, const int64_t *p_slot, const int64_t *p_len,
                      float *out, float *scores, float *tmp) {
    int64_t width = (nh + 2 * nkv) * hd, per_kv = nh / nkv;
    for (int64_t r = 0; r < rows; r++) {
        float *q = qkv + r * width, *k = q + nh * hd, *v = k + nkv * hd;
        const float *cos_row = cos_table + rope_pos[r] * hd, *sin_row = sin_table + rope_pos[r] * hd;
        for (int64_t head = 0; head < nh + nkv; head++) {
            float *x = q + head * hd;
            if (qk_norm) norm_row(x, qk_norm + head * hd, x, hd, eps);
            rope_head(x, cos_row, sin_row, hd, head < nh ? q_scale : 1.0f, tmp);
        }
        float *own_k = k_cache + r * slot_stride, *own_v = v_cache + r * slot_stride;
        for (int64_t g = 0; g < nkv; g++) {
            memcpy(own_k + g * head_stride + local[r] * pos_stride, k + g * hd, (size_t)hd * sizeof(float));
            memcpy(own_v + g * head_stride + local[r] * pos_stride, v + g * hd, (size_t)hd * sizeof(float));
        }
        int64_t prompt = prompt_k ? p_len[r] : 0, own = local[r] + 1, total = prompt + own;
        const float *pk = prompt_k ? prompt_k + p_slot[r] * p_slot_stride : NULL;
        const float *pv = prompt_v ? prompt_v + p_slot[r] * p_slot_stride : NULL;
        for (int64_t h = 0; h < nh; h++) {
            int64_t g = h / per_kv;
            const float *qh = q + h * hd;
            for (int64_t j = 0; j < prompt; j++) scores[j] = dot(qh, pk + g * p_head_stride + j * p_pos_stride, hd);
            for (int64_t j = 0; j < own; j++)
                scores[prompt + j] = dot(qh, own_k + g * head_stride + j * pos_stride, hd);
            float top = scores[0];
            for (int64_t j = 1; j < total; j++) top = scores[j] > top ? scores[j] : top;
            float sum = 0.0f;
            for (int64_t j = 0; j < total; j++) {
                scores[j] = expf(scores[j] - top);
                sum += scores[j];
            }
            float *o = out + r * nh * hd + h * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int64_t j = 0; j < total; j++) {
                float p = scores[j] / sum;
                const float *vj = j < prompt ? pv + g * p_head_stride + j * p_pos_stride
                                             : own_v + g * head_stride + (j - prompt) * pos_stride;
                for (int64_t i = 0; i < hd; i++) o[i] += p * vj[i];
            }
        }
    }
}
