/* What every block loader shares: failing with the layer named, reading tensors checked
 * against their geometry, and spec fields checked against their ranges; and freeing a block. */
#include "model/blocks.h"

#include "kernels/act_stats.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void block_free(Block *b) {
    if (b->kind && b->kind->free) b->kind->free(b->self);
    free(b->self);
    memset(b, 0, sizeof(*b));
}

int bl_fail(BlockLoader *L, const char *fmt, ...) {
    if (L->failed) return -1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (L->layer >= 0) snprintf(L->err, L->errlen, "colibri.json: layer %d: %s", L->layer, msg);
    else snprintf(L->err, L->errlen, "colibri.json: %s", msg);
    L->failed = 1;
    return -1;
}

static const CtTensor *need(BlockLoader *L, const char *name, long long rows, long long cols) {
    if (L->failed) return NULL;
    const CtTensor *t = ct_find(L->ct, name);
    if (!t) {
        snprintf(L->err, L->errlen, "container lacks tensor '%s'; re-run coli convert", name);
        L->failed = 1;
        return NULL;
    }
    if (t->rows != rows || t->cols != cols) {
        snprintf(L->err, L->errlen, "tensor '%s' is [%lld, %lld], the architecture needs [%lld, %lld]", name, t->rows, t->cols,
                 rows, cols);
        L->failed = 1;
        return NULL;
    }
    return t;
}

QMat bl_mat_named(BlockLoader *L, const char *name, int rows, int cols) {
    QMat q = {0};
    const CtTensor *t = need(L, name, rows, cols);
    if (!t) return q;
    q.qt = t->qt;
    q.rows = rows;
    q.cols = cols;
    q.row_bytes = qtype_row_bytes(t->qt, cols);
    q.data = t->st->data;
    act_stats_name(q.data, name);
    return q;
}

static const char *tensor_name(BlockLoader *L, const JsonValue *tensors, const char *key, int optional) {
    const char *name = tensors ? json_get_str(tensors, key) : NULL;
    if (!name && !optional) bl_fail(L, "block names no '%s' tensor; re-run coli convert", key);
    return name;
}

QMat bl_mat(BlockLoader *L, const JsonValue *tensors, const char *key, int rows, int cols) {
    QMat q = {0};
    const char *name = tensor_name(L, tensors, key, 0);
    return name ? bl_mat_named(L, name, rows, cols) : q;
}

/* Small f32 vectors (norms, biases, router) are copied so they are aligned and owned. */
const float *bl_vec_named(BlockLoader *L, const char *name, int rows, int cols) {
    const CtTensor *t = need(L, name, rows, cols);
    if (!t) return NULL;
    if (t->qt != QT_F32) {
        snprintf(L->err, L->errlen, "tensor '%s' must be stored as f32, found %s", name, qtype_name(t->qt));
        L->failed = 1;
        return NULL;
    }
    float *p = malloc((size_t)rows * cols * sizeof(float));
    if (!p) {
        bl_fail(L, "out of memory");
        return NULL;
    }
    memcpy(p, t->st->data, (size_t)rows * cols * sizeof(float));
    return p;
}

const float *bl_vec(BlockLoader *L, const JsonValue *tensors, const char *key, int rows, int cols, int optional) {
    const char *name = tensor_name(L, tensors, key, optional);
    return name ? bl_vec_named(L, name, rows, cols) : NULL;
}

int bl_int(BlockLoader *L, const JsonValue *spec, const char *key, int lo, int hi) {
    const JsonValue *v = json_get(spec, key);
    if (L->failed) return 0;
    if (!v || v->type != JSON_NUM || !v->is_int || v->i < lo || v->i > hi) {
        bl_fail(L, "%s.%s missing or outside [%d, %d]", json_get_str(spec, "kind") ? json_get_str(spec, "kind") : "block", key,
                lo, hi);
        return 0;
    }
    return (int)v->i;
}

double bl_num(BlockLoader *L, const JsonValue *spec, const char *key, double lo, double hi) {
    const JsonValue *v = json_get(spec, key);
    if (L->failed) return 0;
    if (!v || v->type != JSON_NUM || !(v->num >= lo && v->num <= hi)) {
        bl_fail(L, "%s missing or outside [%g, %g]", key, lo, hi);
        return 0;
    }
    return v->num;
}

const char *bl_str(BlockLoader *L, const JsonValue *spec, const char *key) {
    const char *s = json_get_str(spec, key);
    if (!s) bl_fail(L, "%s missing (a string)", key);
    return s;
}

const JsonValue *bl_obj(BlockLoader *L, const JsonValue *spec, const char *key) {
    const JsonValue *o = json_get(spec, key);
    if (!o || o->type != JSON_OBJ) {
        bl_fail(L, "%s missing (an object)", key);
        return NULL;
    }
    return o;
}
