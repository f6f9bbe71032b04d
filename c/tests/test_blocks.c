/* The block table as an extension point: this test adds a toy block kind through
 * blocks_register alone (no engine file changes), builds a two-layer container whose manifest
 * names it, and checks the state descriptors, prefix reuse with a non-truncatable layer
 * (checkpoint fallback, never silent truncation), and slot persistence of its fixed state. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/blocks.h"
#include "check.h"
#include "model/dsa_indexer.h"
#include "kernels/dsa_score.h"
#include "engine/engine_stream.h"
#include "kernels/kv_kernels.h"
#include "kv/kv_persist.h"
#include "kernels/mla_absorb.h"
#include "kernels/ops.h"

enum { V = 16, H = 8, HD = 4, SEQ = 6 };

/* ---- the toy block: out_t = W . mean(x_0..x_t); its state is the running sum (fixed size,
 * and a sum cannot be cut back to an earlier prefix: not truncatable) ---- */
typedef struct {
    QMat w;
} ToyMean;

static int toy_load(void *self, const JsonValue *spec, BlockLoader *L) {
    ((ToyMean *)self)->w = bl_mat(L, json_get(spec, "tensors"), "w", H, H);
    return L->failed ? -1 : 0;
}

static void toy_run(const void *self, const BlockRun *r, const float *x, int T, float *out) {
    float *sum = (float *)r->state->fixed, mean[H];
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < H; d++) {
            sum[d] += x[t * H + d];
            mean[d] = sum[d] / (float)(r->p0 + t + 1);
        }
        matmul(out + t * H, mean, 1, &((const ToyMean *)self)->w, NULL);
    }
}

static StateDesc toy_state(const void *self, QType kv) {
    (void)self;
    (void)kv;
    StateDesc s = {.fixed = sizeof(float) * H};
    return s;
}

static const BlockKind toy_mean = {ROLE_ATTN, "toy_mean", sizeof(ToyMean), toy_load, toy_run, toy_state, NULL, NULL};

/* ---- a container on disk: one f32 safetensors shard + colibri.json ---- */
typedef struct {
    const char *name;
    int rows, cols;
} Spec;
static const Spec TENSORS[] = {
    {"embed", V, H},   {"head", V, H}, {"final_norm", 1, H}, {"n0", 1, H},  {"q0", 2 * HD, H}, {"k0", HD, H}, {"v0", HD, H},
    {"o0", H, 2 * HD}, {"m0", 1, H},   {"gate0", 8, H},      {"up0", 8, H}, {"down0", H, 8},   {"n1", 1, H},  {"w1", H, H},
};
#define NT (sizeof TENSORS / sizeof TENSORS[0])

static void write_container(const char *dir) {
    char path[512], hdr[8192], meta[2048];
    size_t off = 0, hl = 0, ml = 0;
    ml += (size_t)snprintf(meta + ml, sizeof meta - ml, "{");
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    for (size_t i = 0; i < NT; i++) {
        const Spec *s = &TENSORS[i];
        size_t bytes = (size_t)s->rows * s->cols * 4;
        ml += (size_t)snprintf(meta + ml, sizeof meta - ml, "%s\\\"%s\\\":[\\\"f32\\\",%d,%d]", i ? "," : "", s->name, s->rows,
                               s->cols);
        if (s->rows == 1)
            hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],", s->name, s->cols);
        else
            hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],", s->name, s->rows,
                                   s->cols);
        hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "\"data_offsets\":[%zu,%zu]},", off, off + bytes);
        off += bytes;
    }
    snprintf(meta + ml, sizeof meta - ml, "}");
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "\"__metadata__\":{\"format\":\"colibri\",\"colibri.tensors\":\"%s\"}}",
                           meta);
    while ((8 + hl) % 64) hdr[hl++] = ' ';
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    FILE *f = fopen(path, "wb");
    uint64_t n = hl;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    uint32_t rng = 12345;
    for (size_t i = 0; i < NT; i++) {
        const Spec *s = &TENSORS[i];
        int norm = s->rows == 1;
        for (int j = 0; j < s->rows * s->cols; j++) {
            rng = rng * 1664525u + 1013904223u;
            float v = norm ? 1.0f + (float)(rng >> 8) / 16777216.0f * 0.2f : ((float)(rng >> 8) / 16777216.0f - 0.5f);
            fwrite(&v, 4, 1, f);
        }
    }
    fclose(f);
    snprintf(path, sizeof path, "%s/colibri.json", dir);
    f = fopen(path, "w");
    fprintf(
        f,
        "{\"format\":\"colibri-container\",\"format_version\":1,\"family\":\"llama\",\"shards\":[\"model-00001-of-00001.safetensors\"],"
        "\"arch\":{\"vocab_size\":%d,\"hidden_size\":%d,\"num_layers\":2,\"rotary_dim\":%d,\"rope_inv_freq\":[1.0,0.01],"
        "\"max_position_embeddings\":64},"
        "\"trunk\":{\"embed\":\"embed\",\"lm_head\":\"head\",\"final_norm\":{\"kind\":\"rmsnorm\",\"eps\":1e-6,\"tensors\":{\"weight\":\"final_norm\"}}},"
        "\"layers\":["
        "{\"attn_norm\":{\"kind\":\"rmsnorm\",\"eps\":1e-6,\"tensors\":{\"weight\":\"n0\"}},"
        "\"attn\":{\"kind\":\"gqa\",\"heads\":2,\"kv_heads\":1,\"head_dim\":%d,\"rope\":{\"style\":\"neox\",\"dim\":%d},"
        "\"tensors\":{\"q\":\"q0\",\"k\":\"k0\",\"v\":\"v0\",\"o\":\"o0\"}},"
        "\"mlp_norm\":{\"kind\":\"rmsnorm\",\"eps\":1e-6,\"tensors\":{\"weight\":\"m0\"}},"
        "\"mlp\":{\"kind\":\"dense\",\"act\":\"silu\",\"width\":8,\"tensors\":{\"gate\":\"gate0\",\"up\":\"up0\",\"down\":\"down0\"}}},"
        "{\"attn_norm\":{\"kind\":\"rmsnorm\",\"eps\":1e-6,\"tensors\":{\"weight\":\"n1\"}},"
        "\"attn\":{\"kind\":\"toy_mean\",\"tensors\":{\"w\":\"w1\"}},\"mlp\":null}]}",
        V, H, HD, HD, HD);
    fclose(f);
}

/* Last-position logits after feeding toks[0..n) into kv in chunks ending at each cut. */
static void feed(const Model *m, KvCache *kv, const int32_t *toks, int from, int to, float *logits) {
    forward(m, kv, toks + from, to - from, logits, 0);
}

static void test_reuse_rule_without_model(void) {
    StateDesc st[2] = {{8, 0, 1, 0, 0, 0}, {8, 0, 1, 0, 0, 0}};
    Arch a = {0};
    a.n_layers = 2;
    a.kv_type = QT_F32;
    a.state = st;
    KvCache kv;
    CHECK(kv_init(&kv, &a, 16) == 0 && kv.truncatable, "truncatable cache");
    int32_t had[6] = {1, 2, 3, 4, 5, 6}, want[5] = {1, 2, 3, 9, 9};
    memcpy(kv.tokens, had, sizeof had);
    kv.n = 6;
    CHECK(kv_reuse(&kv, want, 5) == 3 && kv.n == 3, "truncatable layers keep the common prefix");
    kv.n = 6;
    CHECK(kv_reuse(&kv, had, 6) == 5, "an identical prompt recomputes its last token");
    kv_free(&kv);

    /* a windowed layer holds a ring of its window: reusable until it wraps, then start over */
    StateDesc win[2] = {{8, 0, 1, 0, 0, 0}, {8, 0, 1, 4, 0, 0}};
    a.state = win;
    CHECK(kv_bytes(&a, 16) == 16 * 4 + 16 * 8 + 4 * 8, "a windowed layer is sized by its window");
    CHECK(kv_init(&kv, &a, 16) == 0 && kv.layer[1].cap == 4 && kv.layer[0].cap == 16, "ring of the window");
    memcpy(kv.tokens, had, sizeof had);
    kv.n = 4;
    CHECK(kv_reuse(&kv, want, 5) == 3, "before the ring wraps any prefix is held");
    kv.n = 6;
    CHECK(kv_held(&kv, 1) == 4 && kv_held(&kv, 0) == 6, "held positions");
    CHECK(kv_reuse(&kv, want, 5) == 0 && kv.n == 0, "a wrapped ring cannot rebuild an earlier prefix");
    kv.n = 6;
    int32_t more[7] = {1, 2, 3, 4, 5, 6, 7};
    CHECK(kv_reuse(&kv, more, 7) == 6, "continuing at the end needs nothing rebuilt");
    kv_free(&kv);
}

static float rnd01(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((*s >> 8) / 16777216.0f) * 2 - 1;
}

/* Every attention kernel this CPU runs agrees with the portable reference on the same inputs:
 * each cache type, head dims on and off the vector width, group sizes past the register tile,
 * position counts around the 4-wide score step and the L1 tile, and scores spread wide enough
 * that the softmax has near-zero weights. Each head's output also must not depend on the group
 * it is computed with (batched prefill equals token by token). */
static void test_kv_attend(void) {
    const QType types[3] = {QT_F32, QT_F16, QT_BF16};
    const int hds[] = {8, 16, 32, 64, 128, 24}, gs[] = {1, 3, 5, 8}, ns[] = {1, 3, 4, 7, 64, 65, 130};
    unsigned seed = 5;
    for (int isa = KI_AVX2; isa < KI_COUNT; isa++) {
        if (!kernels_supported((KernIsa)isa)) continue;
        double worst = 0;
        int same_alone = 1;
        for (int ti = 0; ti < 3; ti++)
            for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
                for (size_t gi = 0; gi < sizeof gs / sizeof *gs; gi++)
                    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                        const int hd = hds[hi], g = gs[gi], n = ns[ni];
                        const size_t es = kv_elem_size(types[ti]), stride = 2 * (size_t)hd * es + 6 * es; /* rows padded */
                        unsigned char *cache = malloc(stride * n);
                        float *q = malloc(sizeof(float) * g * hd), *row = malloc(sizeof(float) * hd);
                        float *sc = malloc(sizeof(float) * kv_attend_scratch(1, g, hd, n)), *o1 = malloc(sizeof(float) * g * hd);
                        float *o2 = malloc(sizeof(float) * g * hd), *o3 = malloc(sizeof(float) * hd);
                        for (int i = 0; i < g * hd; i++) q[i] = 3 * rnd01(&seed);
                        for (int j = 0; j < n; j++)
                            for (int kv = 0; kv < 2; kv++) {
                                for (int d = 0; d < hd; d++) row[d] = rnd01(&seed) * (kv ? 2 : 1);
                                kv_store_row(types[ti], row, hd, cache + j * stride + kv * hd * es);
                            }
                        const KvKernels *port = kv_kernels_for(KI_PORTABLE, types[ti]),
                                        *fast = kv_kernels_for((KernIsa)isa, types[ti]);
                        const float scale = 1.0f / sqrtf((float)hd);
                        port->attend(q, g, hd, cache, cache + hd * es, stride, n, scale, NULL, sc, o1);
                        fast->attend(q, g, hd, cache, cache + hd * es, stride, n, scale, NULL, sc, o2);
                        for (int i = 0; i < g * hd; i++) worst = fmax(worst, fabs(o1[i] - o2[i]) / (1 + fabs(o1[i])));
                        fast->attend(q + (g - 1) * hd, 1, hd, cache, cache + hd * es, stride, n, scale, NULL, sc, o3);
                        same_alone &= !memcmp(o3, o2 + (g - 1) * hd, sizeof(float) * hd);
                        float sinks[8];
                        for (int i = 0; i < g; i++) sinks[i] = 4 * rnd01(&seed);
                        port->attend(q, g, hd, cache, cache + hd * es, stride, n, scale, sinks, sc, o1);
                        fast->attend(q, g, hd, cache, cache + hd * es, stride, n, scale, sinks, sc, o2);
                        for (int i = 0; i < g * hd; i++) worst = fmax(worst, fabs(o1[i] - o2[i]) / (1 + fabs(o1[i])));
                        free(cache);
                        free(q);
                        free(row);
                        free(sc);
                        free(o1);
                        free(o2);
                        free(o3);
                    }
        CHECK(worst < 2e-5, "%s attention differs from portable by %g (relative)", kernels_isa_name((KernIsa)isa), worst);
        CHECK(same_alone, "%s attention: a head's result depends on its group", kernels_isa_name((KernIsa)isa));
    }
}

/* Attending a block of tq positions at once gives each of them the bits it gets alone (tq = 1)
 * over its own positions, on every kernel set, with and without sinks and a sliding window
 * (shorter and longer than the block), for blocks past a score vector and past the K and V
 * tiles; and it agrees with the portable kernel. */
/* The RAM budget's attention share (attend_scratch_floats) covers the scratch the GQA block
 * asks for, whatever the group, head size and context. */
static void test_attend_scratch_budget(void) {
    const int groups[] = {1, 2, 3, 4, 8, 12, 16, 32, 64, 128}, hds[] = {64, 128, 192, 256},
              ctxs[] = {1, 17, 512, 4096, 40960, 131072, 1 << 20};
    int ok = 1;
    for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++)
        for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
            for (size_t ci = 0; ci < sizeof ctxs / sizeof *ctxs; ci++) {
                const int g = groups[gi], hd = hds[hi], ctx = ctxs[ci], tq = kv_attend_block_positions(g, ctx);
                const size_t need = kv_attend_scratch(tq, g, hd, ctx);
                if (need > attend_scratch_floats((uint64_t)g, (uint64_t)hd, (uint64_t)ctx)) {
                    ok = 0;
                    CHECK(0, "g=%d hd=%d ctx=%d: the block asks %zu floats, the budget holds %llu", g, hd, ctx, need,
                          (unsigned long long)attend_scratch_floats((uint64_t)g, (uint64_t)hd, (uint64_t)ctx));
                }
            }
    CHECK(ok, "the budget's attention share covers every block's scratch");
    /* latent attention: chunks of g <= 64 of the nh heads share one head of kl + dr dimensions,
     * and the budget counts it as nh heads of that size */
    const int mla_heads[] = {4, 16, 64, 128}, mla_hds[] = {48, 576}, mla_ctxs[] = {1, 100, 4096, 163840};
    int mla_ok = 1;
    for (size_t hi = 0; hi < sizeof mla_heads / sizeof *mla_heads; hi++)
        for (size_t di = 0; di < sizeof mla_hds / sizeof *mla_hds; di++)
            for (size_t ci = 0; ci < sizeof mla_ctxs / sizeof *mla_ctxs; ci++)
                for (int g = 1; g <= 64 && g <= mla_heads[hi]; g++) {
                    const int nh = mla_heads[hi], hd = mla_hds[di], ctx = mla_ctxs[ci];
                    const size_t need = kv_attend_scratch(kv_attend_block_positions(g, ctx), g, hd, ctx);
                    mla_ok &= need <= attend_scratch_floats((uint64_t)nh, (uint64_t)hd, (uint64_t)ctx);
                }
    CHECK(mla_ok, "the budget's attention share covers latent attention's head chunks");
}

static void test_kv_attend_block(void) {
    const int hds[] = {16, 128, 24}, gs[] = {1, 3, 8}, tqs[] = {2, 5, 9}, n0s[] = {1, 30, 70}, wins[] = {0, 4, 40};
    unsigned seed = 11;
    for (int isa = 0; isa < KI_COUNT; isa++) {
        if (!kernels_supported((KernIsa)isa) || !kv_kernels_for((KernIsa)isa, QT_F16)) continue;
        double worst = 0;
        int same = 1;
        for (int ti = 0; ti < 2; ti++)
            for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
                for (size_t gi = 0; gi < sizeof gs / sizeof *gs; gi++)
                    for (size_t qi = 0; qi < sizeof tqs / sizeof *tqs; qi++)
                        for (size_t ni = 0; ni < sizeof n0s / sizeof *n0s * 3; ni++) {
                            const QType type = ti ? QT_F16 : QT_F32;
                            const int hd = hds[hi], g = gs[gi], tq = tqs[qi], win = wins[ni / 3];
                            const int n0 = win && n0s[ni % 3] > win ? win : n0s[ni % 3], N = n0 + tq - 1;
                            const size_t es = kv_elem_size(type), stride = 2 * (size_t)hd * es, qstep = (size_t)g * hd + 5;
                            unsigned char *cache = malloc(stride * N);
                            float *q = malloc(sizeof(float) * qstep * tq), *row = malloc(sizeof(float) * hd), sinks[8];
                            float *sc = malloc(sizeof(float) * kv_attend_scratch(tq, g, hd, n0));
                            float *ob = malloc(sizeof(float) * qstep * tq), *o1 = malloc(sizeof(float) * g * hd);
                            float *op = malloc(sizeof(float) * g * hd);
                            for (size_t i = 0; i < qstep * tq; i++) q[i] = 3 * rnd01(&seed);
                            for (int i = 0; i < g; i++) sinks[i] = 4 * rnd01(&seed);
                            for (int j = 0; j < N; j++)
                                for (int kv = 0; kv < 2; kv++) {
                                    for (int d = 0; d < hd; d++) row[d] = rnd01(&seed) * (kv ? 2 : 1);
                                    kv_store_row(type, row, hd, cache + j * stride + kv * hd * es);
                                }
                            const KvKernels *kk = kv_kernels_for((KernIsa)isa, type), *port = kv_kernels_for(KI_PORTABLE, type);
                            const float scale = 1.0f / sqrtf((float)hd);
                            for (int sk = 0; sk < 2; sk++) {
                                kk->attend_block(q, qstep, tq, g, hd, cache, cache + hd * es, stride, n0, win, scale,
                                                 sk ? sinks : NULL, sc, ob, qstep);
                                for (int t = 0; t < tq; t++) {
                                    const int lo = win && n0 + t > win ? n0 + t - win : 0;
                                    const unsigned char *row = cache + lo * stride;
                                    kk->attend(q + t * qstep, g, hd, row, row + hd * es, stride, n0 + t - lo, scale,
                                               sk ? sinks : NULL, sc, o1);
                                    same &= !memcmp(o1, ob + t * qstep, sizeof(float) * g * hd);
                                    port->attend(q + t * qstep, g, hd, row, row + hd * es, stride, n0 + t - lo, scale,
                                                 sk ? sinks : NULL, sc, op);
                                    for (int i = 0; i < g * hd; i++) worst = fmax(worst, fabs(op[i] - o1[i]) / (1 + fabs(op[i])));
                                }
                            }
                            free(cache);
                            free(q);
                            free(row);
                            free(sc);
                            free(ob);
                            free(o1);
                            free(op);
                        }
        CHECK(same, "%s attention: a block's position differs from the same position alone", kernels_isa_name((KernIsa)isa));
        CHECK(worst < 2e-5, "%s block attention differs from portable by %g (relative)", kernels_isa_name((KernIsa)isa), worst);
    }
}

/* A sink is one more logit in each head's softmax with no value row: over one position with
 * score s0 the output is V0 / (1 + exp(sink - s0)). */
static void test_kv_attend_sink(void) {
    const int hd = 16;
    float q[16], row[32], o[16], sink = 0.7f, *sc = malloc(sizeof(float) * kv_attend_scratch(1, 1, 16, 1));
    for (int d = 0; d < hd; d++) {
        q[d] = 0.1f * (float)(d - 5);
        row[d] = 0.05f * (float)d;
        row[hd + d] = 1.0f + 0.25f * (float)d;
    }
    float s0 = 0;
    for (int d = 0; d < hd; d++) s0 += q[d] * row[d];
    s0 *= 0.25f;
    for (int isa = 0; isa < KI_COUNT; isa++) {
        const KvKernels *k = kernels_supported((KernIsa)isa) ? kv_kernels_for((KernIsa)isa, QT_F32) : NULL;
        if (!k) continue;
        k->attend(q, 1, hd, row, row + hd, sizeof row, 1, 0.25f, &sink, sc, o);
        double worst = 0;
        for (int d = 0; d < hd; d++) worst = fmax(worst, fabs(o[d] - row[hd + d] / (1 + exp(sink - s0))));
        CHECK(worst < 1e-5, "%s attention with a sink is off by %g", kernels_isa_name((KernIsa)isa), worst);
    }
    free(sc);
}

/* The run-time chosen f16/bf16 cache kernels agree with the portable ones, tails included. */
static void test_kv_kernels(void) {
    const QType types[2] = {QT_F16, QT_BF16};
    for (int ti = 0; ti < 2; ti++) {
        QType t = types[ti];
        const KvKernels *fast = kv_kernels(t);
        kernels_init(1);
        const KvKernels *port = kv_kernels(t);
        kernels_init(0);
        float q[133], x[133], back[133], o1[133], o2[133];
        uint16_t row[133];
        for (int i = 0; i < 133; i++) {
            q[i] = (float)((i * 37) % 19) / 7.0f - 1.3f;
            x[i] = (float)((i * 11) % 23) / 5.0f - 2.1f;
        }
        kv_store_row(t, x, 133, row);
        for (int i = 0; i < 133; i++) back[i] = t == QT_F16 ? f16_to_f32(row[i]) : bf16_to_f32(row[i]);
        int ok = 1;
        for (int i = 0; i < 133; i++) ok &= fabsf(back[i] - x[i]) <= fabsf(x[i]) * (t == QT_F16 ? 1e-3f : 8e-3f);
        CHECK(ok, "%s store rounds to nearest", qtype_name(t));
        const int ns[] = {1, 7, 8, 15, 16, 33, 128, 133};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int n = ns[k];
            double ref = 0;
            for (int i = 0; i < n; i++) ref += (double)q[i] * back[i];
            float a = fast->dot(q, row, n), b = port->dot(q, row, n);
            CHECK(fabs(a - ref) < 1e-4 * (1 + fabs(ref)) && fabs(b - ref) < 1e-4 * (1 + fabs(ref)), "%s dot n=%d: %g %g vs %g",
                  qtype_name(t), n, a, b, ref);
            for (int i = 0; i < n; i++) o1[i] = o2[i] = q[i];
            fast->axpy(0.75f, row, n, o1);
            port->axpy(0.75f, row, n, o2);
            int same = 1;
            for (int i = 0; i < n; i++) same &= fabsf(o1[i] - o2[i]) <= 1e-6f * (1 + fabsf(o2[i]));
            CHECK(same, "%s axpy n=%d", qtype_name(t), n);
        }
    }
    test_kv_attend();
    test_kv_attend_sink();
    test_kv_attend_block();
    test_attend_scratch_budget();
}

/* The indexer's top-k is the k largest scores with ties going to the lower index, against a
 * plain reference (rank each score by how many others beat it), over inputs with many ties
 * (the ReLU'd scores are often exactly 0), single values, k at and past n. */
static void test_dsa_mark_top(void) {
    unsigned seed = 5;
    int ok = 1;
    const int ns[] = {1, 2, 7, 64, 300, 1000}, ks[] = {1, 3, 16, 64, 299, 2048};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
            for (int levels = 1; levels <= 1000; levels *= 10) {
                const int n = ns[ni], k = ks[ki];
                float *s = malloc(sizeof(float) * n);
                unsigned char *got = calloc(n, 1);
                for (int j = 0; j < n; j++) s[j] = (float)((int)(rnd01(&seed) * levels) % levels) - 0.5f * levels;
                dsa_mark_top(s, n, k, got);
                for (int j = 0; j < n; j++) { /* j is kept iff fewer than k scores rank above it */
                    int above = 0;
                    for (int i = 0; i < n; i++) above += s[i] > s[j] || (s[i] == s[j] && i < j);
                    ok &= got[j] == (above < k);
                }
                free(s);
                free(got);
            }
    CHECK(ok, "dsa_mark_top keeps the k best, ties to the lower index");
}

/* Latent attention's absorption gives the one-row scalar loop's bits (zeros, then a multiply and
 * an add per term in d order) in every kernel set, for position counts around its register block
 * and a kl with a scalar tail; rows are strided as in the engine. */
static void test_mla_absorb(void) {
    enum { DN = 7, KL = 40, WS = 48, QS = 11, OS = 45, TMAX = 9 };
    unsigned seed = 9;
    float w[DN * WS], q[TMAX * QS], want[TMAX * OS], got[TMAX * OS];
    for (int i = 0; i < DN * WS; i++) w[i] = rnd01(&seed) * 2 - 1;
    for (int i = 0; i < TMAX * QS; i++) q[i] = rnd01(&seed) * 2 - 1;
    for (int t = 0; t < TMAX; t++)
        for (int c = 0; c < KL; c++) {
            float a = 0;
            for (int d = 0; d < DN; d++) a += q[t * QS + d] * w[d * WS + c];
            want[t * OS + c] = a;
        }
    for (int isa = 0; isa < KI_COUNT; isa++) {
        MlaAbsorbFn f = kernels_supported((KernIsa)isa) ? kernels_table((KernIsa)isa)->mla_absorb : NULL;
        if (!f) continue;
        for (int tn = 1; tn <= TMAX; tn++) {
            memset(got, 0xff, sizeof got);
            f(got, OS, q, QS, tn, w, WS, DN, KL);
            int ok = 1;
            for (int t = 0; t < tn; t++) ok &= !memcmp(got + t * OS, want + t * OS, sizeof(float) * KL);
            ok &= got[OS - 1] != got[OS - 1] || tn == 0; /* a row's padding past kl is not written (NaN fill kept) */
            CHECK(ok, "mla absorb %s, %d positions: the scalar loop's bits", kernels_isa_name((KernIsa)isa), tn);
        }
    }
}

/* The DSA indexer's scores in every kernel set against the definition in double precision: head
 * counts below, at and past a vector of lanes, key runs around the four-key step, keys strided
 * as in the state rows (after the latent), negative dots (the ReLU) included. A key's score
 * must not depend on the run it is scored in (decode splits the keys across threads). */
static void test_dsa_scores(void) {
    enum { HD = 24, STRIDE = 136, NMAX = 11 };
    unsigned seed = 21;
    const int heads[] = {1, 7, 16, 33};
    for (size_t hi = 0; hi < sizeof heads / sizeof *heads; hi++) {
        const int nh = heads[hi];
        float q[33 * HD], w[33], want[NMAX], got[NMAX], part[NMAX];
        unsigned char keys[NMAX * STRIDE];
        for (int i = 0; i < nh * HD; i++) q[i] = rnd01(&seed) * 2 - 1;
        for (int h = 0; h < nh; h++) w[h] = rnd01(&seed) * 2 - 1;
        for (int j = 0; j < NMAX; j++)
            for (int i = 0; i < HD; i++) ((float *)(keys + (size_t)j * STRIDE))[i] = rnd01(&seed) * 2 - 1;
        const float scale = 0.2f, wscale = 0.5f;
        double mag = 0;
        for (int j = 0; j < NMAX; j++) {
            double acc = 0;
            for (int h = 0; h < nh; h++) {
                double d = 0;
                for (int i = 0; i < HD; i++) d += (double)q[h * HD + i] * ((float *)(keys + (size_t)j * STRIDE))[i];
                d *= scale;
                acc += d > 0 ? (double)w[h] * wscale * d : 0;
                mag += d > 0 ? fabs(w[h] * wscale * d) : 0;
            }
            want[j] = (float)acc;
        }
        for (int isa = 0; isa < KI_COUNT; isa++) {
            if (!kernels_supported((KernIsa)isa) || kernels_use((KernIsa)isa)) continue;
            DsaScoreFn f = kernels_table((KernIsa)isa)->dsa_scores;
            for (int n = 1; n <= NMAX; n++) {
                f(q, w, nh, HD, keys, STRIDE, n, scale, wscale, got);
                int ok = 1;
                for (int j = 0; j < n; j++) ok &= fabs(got[j] - want[j]) <= 1e-5 * (mag / NMAX + 1e-3);
                f(q, w, nh, HD, keys + 3 * STRIDE, STRIDE, n > 3 ? n - 3 : 0, scale, wscale, part);
                for (int j = 3; j < n; j++) ok &= !memcmp(&part[j - 3], &got[j], sizeof(float));
                CHECK(ok, "dsa scores %s, %d heads, %d keys", kernels_isa_name((KernIsa)isa), nh, n);
            }
        }
        kernels_init(0);
    }
}

void test_kv_kernel_sets(void) {
    test_kv_kernels();
    test_mla_absorb();
    test_dsa_scores();
}

void test_blocks(void) {
    test_kv_kernel_sets();
    test_dsa_mark_top();
    test_reuse_rule_without_model();
    char dir[] = "/tmp/coli_blocks_XXXXXX", err[512];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    write_container(dir);
    Model m;
    CHECK(model_load(&m, dir, err, sizeof err) == -1 && strstr(err, "toy_mean") && strstr(err, "not implemented"),
          "an unknown kind is refused by name: %s", err);
    CHECK(blocks_register(&toy_mean) == 0 && blocks_register(&toy_mean) == -1, "register once");
    if (model_load(&m, dir, err, sizeof err)) {
        CHECK(0, "load: %s", err);
        return;
    }
    CHECK(m.state[0].per_pos == 2 * HD * 2 && m.state[0].fixed == 0 && m.state[0].truncatable, "gqa: f16 K+V per position");
    CHECK(m.state[1].per_pos == 0 && m.state[1].fixed == sizeof(float) * H && !m.state[1].truncatable, "toy: fixed state");
    CHECK(kv_bytes(&m.a, 10) == 10 * (2 * HD * 2 + 4) + sizeof(float) * H, "kv_bytes sums the descriptors");
    CHECK(kv_bytes_per_token(&m.a) == 2 * HD * 2, "per token: only per-position state, not the fixed state");
    CHECK(model_set_kv_type(&m, QT_F32, err, sizeof err) == 0 && m.state[0].per_pos == 2 * HD * 4, "f32 K+V");

    const int32_t A[SEQ] = {1, 5, 7, 2, 9, 3}, B[SEQ] = {1, 5, 7, 2, 4, 8}, C[SEQ] = {1, 5, 6, 6, 6, 6};
    float got[V], want[V], bad[V];
    KvCache kv, fresh;
    /* turn 1: prompt A[0..3) (checkpoint at 3), then three more positions (checkpoint at 6) */
    kv_init(&kv, &m.a, 32);
    CHECK(!kv.truncatable, "a toy layer makes the slot non-truncatable");
    feed(&m, &kv, A, 0, 3, got);
    kv_checkpoint(&kv);
    feed(&m, &kv, A, 3, SEQ, got);
    kv_checkpoint(&kv);
    CHECK(kv.n_ck == 2 && kv.ck_pos[0] == 3 && kv.ck_pos[1] == 6, "checkpoints at turn boundaries");
    /* B shares 4 tokens with A: the toy state exists only at 3 and 6, so reuse must fall back to 3 */
    int keep = kv_reuse(&kv, B, SEQ);
    CHECK(keep == 3 && kv.n == 3 && kv.n_ck == 1, "falls back to the checkpoint at 3, not the common prefix 4 (%d)", keep);
    feed(&m, &kv, B, 3, SEQ, got);
    kv_init(&fresh, &m.a, 32);
    feed(&m, &fresh, B, 0, 3, want);
    feed(&m, &fresh, B, 3, SEQ, want);
    CHECK(!memcmp(got, want, sizeof got), "reused slot = fresh slot, bit for bit");
    /* the silent truncation this rule prevents gives a different answer (the test can fail) */
    kv_free(&fresh);
    kv_init(&fresh, &m.a, 32);
    feed(&m, &fresh, A, 0, SEQ, bad);
    fresh.n = 4;
    feed(&m, &fresh, B, 4, SEQ, bad);
    CHECK(memcmp(bad, want, sizeof bad) != 0, "naive truncation would be wrong");
    kv_free(&fresh);
    /* C diverges before every checkpoint: start over */
    CHECK(kv_reuse(&kv, C, SEQ) == 0 && kv.n_ck == 0, "no usable checkpoint: reuse nothing");
    feed(&m, &kv, C, 0, SEQ, got);
    kv_init(&fresh, &m.a, 32);
    feed(&m, &fresh, C, 0, SEQ, want);
    CHECK(!memcmp(got, want, sizeof got), "restart = fresh");
    kv_free(&fresh);

    /* persistence carries the fixed state: a restored slot continues like the original */
    char path[600];
    snprintf(path, sizeof path, "%s/.coli_kv", dir);
    CHECK(kv_save(&kv, &m.a, 42, path, err, sizeof err) == 0, "save: %s", err);
    KvCache back;
    kv_init(&back, &m.a, 32);
    CHECK(kv_restore(&back, &m.a, 42, path, err, sizeof err) == 1 && back.n == SEQ, "restore: %s", err);
    const int32_t next = 11;
    forward(&m, &kv, &next, 1, want, 0);
    forward(&m, &back, &next, 1, got, 0);
    CHECK(!memcmp(got, want, sizeof got), "restored slot continues bit for bit");
    kv_free(&back);
    /* and its turn-boundary checkpoints: a restored slot falls back exactly as the original */
    kv_checkpoint(&kv); /* turn boundaries at SEQ + 1 and SEQ + 2 */
    const int32_t D[SEQ + 2] = {1, 5, 6, 6, 6, 6, 11, 2}, E[SEQ + 2] = {1, 5, 6, 6, 6, 6, 11, 3};
    feed(&m, &kv, D, SEQ + 1, SEQ + 2, want);
    kv_checkpoint(&kv);
    CHECK(kv.n_ck == 2 && kv_save(&kv, &m.a, 42, path, err, sizeof err) == 0, "save with checkpoints: %s", err);
    kv_init(&back, &m.a, 32);
    CHECK(kv_restore(&back, &m.a, 42, path, err, sizeof err) == 1 && back.n_ck == 2 && back.ck_pos[0] == SEQ + 1 &&
              !memcmp(back.ck[0], kv.ck[0], kv.fixed_total),
          "checkpoints restored byte for byte: %s", err);
    /* E leaves D at its last token: both go back to the checkpoint at SEQ + 1 */
    CHECK(kv_reuse(&kv, E, SEQ + 2) == SEQ + 1 && kv_reuse(&back, E, SEQ + 2) == SEQ + 1, "both fall back to SEQ + 1");
    feed(&m, &kv, E, SEQ + 1, SEQ + 2, want);
    feed(&m, &back, E, SEQ + 1, SEQ + 2, got);
    CHECK(!memcmp(got, want, sizeof got), "restored checkpoint continues bit for bit");
    kv_free(&back);
    /* a checkpoint position past the slot's history: refused, the slot starts empty */
    CHECK(kv_save(&kv, &m.a, 42, path, err, sizeof err) == 0, "save: %s", err);
    FILE *pf = fopen(path, "r+b");
    long ck_at = 48 + 4L * kv.n; /* header, tokens, then the layers' state */
    for (int l = 0; l < kv.n_layers; l++)
        ck_at += (long)(kv.layer[l].per_pos * (size_t)kv_held(&kv, l) + kv.layer[l].fixed_bytes);
    int32_t past = kv.n + 5;
    fseek(pf, ck_at, SEEK_SET);
    fwrite(&past, sizeof past, 1, pf);
    fclose(pf);
    kv_init(&back, &m.a, 32);
    CHECK(kv_restore(&back, &m.a, 42, path, err, sizeof err) == -1 && back.n == 0 && back.n_ck == 0 && strstr(err, "corrupt"),
          "bad checkpoint position refused: %s", err);
    kv_free(&back);
    kv_free(&kv);
    model_free(&m);
    unlink(path);
    snprintf(path, sizeof path, "%s/colibri.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    unlink(path);
    rmdir(dir);
}
