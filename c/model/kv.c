/* KV slots, built from the layers' state descriptors: allocation, prefix reuse, checkpoints. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static int ring_cap(const StateDesc *s, int ctx) { return s->window > 0 && s->window < ctx ? s->window : ctx; }

size_t kv_bytes(const Arch *a, int ctx) {
    size_t b = sizeof(int32_t) * (size_t)ctx;
    for (int l = 0; l < a->n_layers; l++) b += a->state[l].per_pos * (size_t)ring_cap(&a->state[l], ctx) + a->state[l].fixed;
    return b;
}

size_t kv_checkpoint_bytes(const Arch *a, int ctx) {
    size_t fixed = 0, ring = 0;
    int truncatable = 1;
    for (int l = 0; l < a->n_layers; l++) {
        const StateDesc *s = &a->state[l];
        fixed += s->fixed;
        if (ring_cap(s, ctx) < ctx) ring += s->per_pos * (size_t)ring_cap(s, ctx);
        truncatable &= s->truncatable;
    }
    return (truncatable || !fixed) && !ring ? 0 : fixed + ring; /* the test of kv_keeps_checkpoints */
}

size_t kv_bytes_per_token(const Arch *a) {
    size_t b = 0;
    for (int l = 0; l < a->n_layers; l++) b += a->state[l].per_pos;
    return b;
}

int kv_held(const KvCache *kv, int l) { return kv->n < kv->layer[l].cap ? kv->n : kv->layer[l].cap; }

int kv_init(KvCache *kv, const Arch *a, int ctx) {
    memset(kv, 0, sizeof(*kv));
    kv->ctx = ctx;
    kv->n_layers = a->n_layers;
    kv->type = a->kv_type;
    kv->truncatable = 1;
    kv->layer = calloc((size_t)a->n_layers, sizeof(KvLayer));
    kv->tokens = malloc(sizeof(int32_t) * (size_t)ctx);
    if (!kv->layer || !kv->tokens) {
        kv_free(kv);
        return -1;
    }
    for (int l = 0; l < a->n_layers; l++) {
        const StateDesc *s = &a->state[l];
        KvLayer *y = &kv->layer[l];
        y->per_pos = s->per_pos;
        y->fixed_bytes = s->fixed;
        y->f32_tail = s->f32_tail;
        y->settle = s->settle;
        y->cap = ring_cap(s, ctx);
        y->truncatable = s->truncatable;
        if (s->per_pos && !(y->pos = malloc(s->per_pos * (size_t)y->cap))) {
            kv_free(kv);
            return -1;
        }
        if (s->fixed && !(y->fixed = calloc(1, s->fixed))) {
            kv_free(kv);
            return -1;
        }
        kv->fixed_total += s->fixed;
        if (y->cap < ctx) kv->ring_total += s->per_pos * (size_t)y->cap;
        kv->truncatable &= s->truncatable;
    }
    return 0;
}

void kv_free(KvCache *kv) {
    for (int l = 0; kv->layer && l < kv->n_layers; l++) {
        free(kv->layer[l].pos);
        free(kv->layer[l].fixed);
    }
    for (int i = 0; i < kv->n_ck; i++) free(kv->ck[i]);
    free(kv->layer);
    free(kv->tokens);
    memset(kv, 0, sizeof(*kv));
}

/* Every layer's fixed state, then every ring (a windowed layer's whole buffer: the positions
 * it holds are those before the checkpoint), concatenated into a checkpoint (save) or back. */
static void fixed_copy(KvCache *kv, unsigned char *ck, int save) {
    size_t off = 0;
    for (int l = 0; l < kv->n_layers; l++) {
        KvLayer *y = &kv->layer[l];
        if (!y->fixed_bytes) continue;
        if (save) memcpy(ck + off, y->fixed, y->fixed_bytes);
        else memcpy(y->fixed, ck + off, y->fixed_bytes);
        off += y->fixed_bytes;
    }
    for (int l = 0; l < kv->n_layers; l++) {
        KvLayer *y = &kv->layer[l];
        if (!y->per_pos || y->cap >= kv->ctx) continue;
        size_t n = y->per_pos * (size_t)y->cap;
        if (save) memcpy(ck + off, y->pos, n);
        else memcpy(y->pos, ck + off, n);
        off += n;
    }
}

void kv_fixed_save(KvCache *kv, unsigned char *dst) { fixed_copy(kv, dst, 1); }
void kv_fixed_load(KvCache *kv, const unsigned char *src) { fixed_copy(kv, (unsigned char *)src, 0); }

static void drop_checkpoint(KvCache *kv, int i) {
    free(kv->ck[i]);
    memmove(kv->ck + i, kv->ck + i + 1, sizeof(kv->ck[0]) * (size_t)(kv->n_ck - i - 1));
    memmove(kv->ck_pos + i, kv->ck_pos + i + 1, sizeof(kv->ck_pos[0]) * (size_t)(kv->n_ck - i - 1));
    kv->n_ck--;
}

int kv_keeps_checkpoints(const KvCache *kv) {
    /* any prefix is reusable without one, unless a ring may wrap past it */
    return !((kv->truncatable || !kv->fixed_total) && !kv->ring_total);
}

size_t kv_ck_bytes(const KvCache *kv) { return kv->fixed_total + kv->ring_total; }

void kv_set_checkpoints(KvCache *kv, int n_ck, const int32_t *pos, const unsigned char *bytes) {
    while (kv->n_ck) drop_checkpoint(kv, kv->n_ck - 1);
    const size_t b = kv_ck_bytes(kv);
    for (int i = 0; i < n_ck && i < KV_MAX_CHECKPOINTS; i++) {
        unsigned char *ck = malloc(b ? b : 1);
        if (!ck) return;
        memcpy(ck, bytes + (size_t)i * b, b);
        kv->ck[kv->n_ck] = ck;
        kv->ck_pos[kv->n_ck++] = pos[i];
    }
}

void kv_checkpoint(KvCache *kv) {
    if (!kv_keeps_checkpoints(kv)) return;
    if (kv->n_ck && kv->ck_pos[kv->n_ck - 1] == kv->n) return;
    if (kv->n_ck == KV_MAX_CHECKPOINTS) drop_checkpoint(kv, 0); /* bounded: the oldest goes */
    unsigned char *ck = malloc(kv->fixed_total + kv->ring_total);
    if (!ck) return; /* without it, reuse falls back further; never wrong, only slower */
    fixed_copy(kv, ck, 1);
    kv->ck[kv->n_ck] = ck;
    kv->ck_pos[kv->n_ck++] = kv->n;
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* A ring that has wrapped no longer holds the positions an earlier prefix needs. */
static int rings_wrapped(const KvCache *kv) {
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layer[l].per_pos && kv->n > kv->layer[l].cap) return 1;
    return 0;
}

static void reset_fixed(KvCache *kv) {
    for (int l = 0; l < kv->n_layers; l++)
        if (kv->layer[l].fixed) memset(kv->layer[l].fixed, 0, kv->layer[l].fixed_bytes);
}

void kv_restart(KvCache *kv) {
    reset_fixed(kv);
    while (kv->n_ck) drop_checkpoint(kv, kv->n_ck - 1);
    kv->n = 0;
}

int kv_reuse(KvCache *kv, const int32_t *ids, int n) {
    int keep = lcp(kv->tokens, kv->n, ids, n);
    if (keep >= n) keep = n - 1; /* the last prompt token is recomputed for fresh logits */
    if (keep < 0) keep = 0;
    kv->last_common = keep;
    if (keep != kv->n && (!kv->truncatable || rings_wrapped(kv))) {
        /* The fixed state only describes position kv->n, and a wrapped ring only the positions
         * before it: go back to a checkpoint at or before keep whose tokens are still the
         * prompt's, else start over. */
        int best = -1;
        for (int i = 0; i < kv->n_ck; i++)
            if (kv->ck_pos[i] <= keep && (best < 0 || kv->ck_pos[i] > kv->ck_pos[best])) best = i;
        if (best >= 0) {
            fixed_copy(kv, kv->ck[best], 0);
            keep = kv->ck_pos[best];
        } else {
            reset_fixed(kv);
            keep = 0;
        }
    }
    for (int i = kv->n_ck - 1; i >= 0; i--) /* checkpoints past the kept prefix describe other tokens */
        if (kv->ck_pos[i] > keep) drop_checkpoint(kv, i);
    kv->n = keep;
    return keep;
}
