/* The element-wise parts of a sampler decode step, one call each per layer, and its matmuls of a few rows (see
 * decode_kernel.py).
 *
 * A decode step of a few rows is hundreds of tiny torch calls of a few microseconds each; here the RMSNorms, the
 * q/k norms, the rotary embedding, the K/V cache write and the attention over the cache of one layer are a handful
 * of plain loops. tc_matmul multiplies a few rows (MATMUL_MAX_ROWS in decode_kernel.py) by a weight read in place,
 * in the layout oneDNN packed it in (blocks of 64 outputs, shared between the calling thread and helper threads);
 * larger matmuls stay torch's (oneDNN). All arithmetic is fp32 and, like torch's kernels, rounds every product and
 * sum on its own (built with -ffp-contract=off: no fused multiply-adds), so results differ from the torch path only
 * in the order of the sums (dot products, softmax normaliser): fp32 rounding.
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
 * signed-sin table has rotate_half's sign folded into its first half, as in sampling.decoder_model). */
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

/* ---------------------------------------------------------------------------------------------------------------
 * Matmuls of a few rows over a weight in oneDNN's packed fp32 layout, on the calling thread plus helper threads.
 *
 * oneDNN packs an fp32 weight [out, in] as blocks of 64 outputs: element (o, i) at (o / 64) * block_stride +
 * i * 64 + o % 64 (decode_kernel.py checks this layout for each weight shape before using it). A block is one
 * contiguous stream, and a row's 64 outputs of it are 64 running sums that take one weight vector per input: the
 * access pattern that reads memory fastest. With one or a few rows the matmul is bound by reading the weight, and
 * one core does not saturate the memory bus, so the blocks are shared out between the calling thread and helper
 * threads: each takes the next unclaimed block until none is left. The caller never waits for a block no one has
 * started, only for blocks a helper is in the middle of, so a helper that is descheduled (a busy machine) costs at
 * most one block's time, not the whole matmul.
 * --------------------------------------------------------------------------------------------------------------- */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#define BLOCK 64
#define MAX_HELPERS 15

#if defined(__GNUC__) && !defined(__clang__)
/* Fused multiply-adds, as oneDNN's kernels use: these sums are reordered against torch's anyway. */
#define CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define CONTRACT
#endif

/* y[r, o0 + j] = sum_i x[r, i] * w[i * 64 + j] (+ bias) for j < width, for NR rows (1..4) at once. */
#define BLOCK_ROWS(NR)                                                                                               \
    CONTRACT CLONES static void block_rows_##NR(const float *w, const float *x, int64_t in, const float *bias,      \
                                                float *y, int64_t out, int64_t width) {                            \
        float acc[NR][BLOCK];                                                                                        \
        for (int r = 0; r < NR; r++)                                                                                 \
            for (int j = 0; j < BLOCK; j++) acc[r][j] = 0.0f;                                                        \
        for (int64_t i = 0; i < in; i++) {                                                                           \
            const float *wi = w + i * BLOCK;                                                                         \
            for (int r = 0; r < NR; r++) {                                                                           \
                float xv = x[r * in + i];                                                                            \
                for (int j = 0; j < BLOCK; j++) acc[r][j] += wi[j] * xv;                                             \
            }                                                                                                        \
        }                                                                                                            \
        for (int r = 0; r < NR; r++)                                                                                 \
            for (int64_t j = 0; j < width; j++) y[r * out + j] = bias ? acc[r][j] + bias[j] : acc[r][j];           \
    }
BLOCK_ROWS(1)
BLOCK_ROWS(2)
BLOCK_ROWS(3)
BLOCK_ROWS(4)

typedef struct {
    const float *w, *bias, *x;
    float *y;
    int64_t rows, in, out, block_stride, blocks;
} matmul_job;

/* One block (all rows, four at a time: 4 x 64 running sums fill half of AVX-512's registers). */
static void run_block(const matmul_job *job, int64_t b) {
    int64_t o0 = b * BLOCK, width = job->out - o0 < BLOCK ? job->out - o0 : BLOCK;
    const float *w = job->w + b * job->block_stride, *bias = job->bias ? job->bias + o0 : NULL;
    for (int64_t r = 0; r < job->rows; r += 4) {
        const float *x = job->x + r * job->in;
        float *y = job->y + r * job->out + o0;
        switch (job->rows - r < 4 ? job->rows - r : 4) {
        case 1: block_rows_1(w, x, job->in, bias, y, job->out, width); break;
        case 2: block_rows_2(w, x, job->in, bias, y, job->out, width); break;
        case 3: block_rows_3(w, x, job->in, bias, y, job->out, width); break;
        default: block_rows_4(w, x, job->in, bias, y, job->out, width); break;
        }
    }
}

/* The pool: one job at a time (the caller holding pool_lock). `gate` packs the job's generation (bits 17 and up),
 * whether it is closed to new helpers (bit 16) and how many helpers are working on it (bits 0-15). A helper joins
 * by incrementing the count while the job is open; the caller closes the job once no block is left and waits for
 * the count to drop to zero, so it never waits for a helper that has not joined. */
#define GEN_ONE ((uint64_t)1 << 17)
#define CLOSED ((uint64_t)1 << 16)
#define ACTIVE ((uint64_t)0xffff)
/* How long an idle helper spins before it sleeps: longer than the gap between two matmuls of a decode step
 * (microseconds), far shorter than a pause between requests. */
#define SPIN_NS 200000

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static matmul_job pool_job;
static _Atomic int64_t next_block;
static _Atomic uint64_t gate;
static _Atomic int helpers_wanted, sleepers;
static int helpers_started;

static void take_blocks(const matmul_job *job) {
    for (;;) {
        int64_t b = atomic_fetch_add_explicit(&next_block, 1, memory_order_relaxed);
        if (b >= job->blocks) return;
        run_block(job, b);
    }
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void pause_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *helper_main(void *arg) {
    int index = (int)(intptr_t)arg;
    uint64_t seen = atomic_load(&gate) & ~(GEN_ONE - 1);
    int64_t idle_since = now_ns();
    for (unsigned spins = 0;; spins++) {
        uint64_t g = atomic_load(&gate);
        if ((g & ~(GEN_ONE - 1)) != seen) {
            seen = g & ~(GEN_ONE - 1);
            /* Join while the job is open and this helper is one of the ones wanted for it. */
            while (!(g & CLOSED) && (g & ~(GEN_ONE - 1)) == seen && index < atomic_load(&helpers_wanted)) {
                if (atomic_compare_exchange_weak(&gate, &g, g + 1)) {
                    take_blocks(&pool_job);
                    atomic_fetch_sub(&gate, 1);
                    break;
                }
            }
            idle_since = now_ns();
            continue;
        }
        pause_cpu();
        if ((spins & 255) == 0 && now_ns() - idle_since > SPIN_NS) {
            pthread_mutex_lock(&sleep_lock);
            atomic_fetch_add(&sleepers, 1);
            while ((atomic_load(&gate) & ~(GEN_ONE - 1)) == seen) pthread_cond_wait(&wake, &sleep_lock);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&sleep_lock);
        }
    }
    return NULL;
}

/* A forked child has none of the parent's helper threads: start again from an empty pool. */
static void pool_after_fork(void) {
    pthread_mutex_t fresh_mutex = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    pool_lock = fresh_mutex;
    sleep_lock = fresh_mutex;
    wake = fresh_cond;
    helpers_started = 0;
    atomic_store(&gate, 0);
    atomic_store(&sleepers, 0);
}

static int ensure_helpers(int count) {
    static int registered;
    if (!registered) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        registered = 1;
    }
    /* Helpers start with every signal blocked (a new thread inherits the mask): Ctrl-C and the like go to the
     * interpreter's threads, never to a helper. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &saved);
    while (helpers_started < count) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attr, helper_main, (void *)(intptr_t)helpers_started);
        pthread_attr_destroy(&attr);
        if (failed) break;
        helpers_started++;
    }
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    return helpers_started < count ? helpers_started : count;
}

/* y [rows, out] = x [rows, in] @ W^T (+ bias) for W packed as described above, on `threads` threads (the caller
 * and threads - 1 helpers). Another thread's matmul in progress: this one runs on the caller alone. */
void tc_matmul(const float *w, int64_t block_stride, const float *bias, const float *x, float *y, int64_t rows,
               int64_t in, int64_t out, int64_t threads) {
    matmul_job job = {w, bias, x, y, rows, in, out, block_stride, (out + BLOCK - 1) / BLOCK};
    int64_t wanted = threads - 1 < job.blocks - 1 ? threads - 1 : job.blocks - 1;
    if (wanted > MAX_HELPERS) wanted = MAX_HELPERS;
    if (wanted < 1 || pthread_mutex_trylock(&pool_lock) != 0) {
        for (int64_t b = 0; b < job.blocks; b++) run_block(&job, b);
        return;
    }
    atomic_store(&helpers_wanted, ensure_helpers((int)wanted));
    pool_job = job;
    atomic_store(&next_block, 0);
    /* New generation, open, no helper yet; a sleeping helper is woken (one system call per burst of matmuls). */
    atomic_store(&gate, (atomic_load(&gate) & ~(GEN_ONE - 1)) + GEN_ONE);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    take_blocks(&pool_job);
    atomic_fetch_or(&gate, CLOSED);
    while (atomic_load(&gate) & ACTIVE) pause_cpu();
    pthread_mutex_unlock(&pool_lock);
}
