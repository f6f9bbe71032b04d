/* The sigmoid group-limited router on hand-made scores: groups are ranked by the sum of their
 * two best (biased) scores, not by their best one; the correction bias moves selection only;
 * weights are the unbiased scores, renormalised, times the routed scaling factor. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/blocks.h"
#include "check.h"

enum { E = 8, HID = 8 };

/* One f32 shard with "w" [E][HID] (identity: router logit e = x[e]) and "b" [E], and a manifest. */
static int write_router_container(const char *dir, const float *bias) {
    char path[512], hdr[1024];
    size_t wb = (size_t)E * HID * 4, bb = (size_t)E * 4;
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]},"
                      "\"__metadata__\":{\"format\":\"colibri\",\"colibri.tensors\":"
                      "\"{\\\"w\\\":[\\\"f32\\\",%d,%d],\\\"b\\\":[\\\"f32\\\",1,%d]}\"}}",
                      E, HID, wb, E, wb, wb + bb, E, HID, E);
    while ((8 + hl) % 64) hdr[hl++] = ' ';
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t n = (uint64_t)hl;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, (size_t)hl, f);
    for (int e = 0; e < E; e++)
        for (int h = 0; h < HID; h++) {
            float v = e == h ? 1.0f : 0.0f;
            fwrite(&v, 4, 1, f);
        }
    fwrite(bias, 4, E, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/colibri.json", dir);
    if (!(f = fopen(path, "w"))) return -1;
    fprintf(f, "{\"format\":\"colibri-container\",\"format_version\":1,\"shards\":[\"model-00001-of-00001.safetensors\"]}");
    fclose(f);
    return 0;
}

static float logit(float p) { return logf(p / (1.0f - p)); }

/* Routes one position through router kind `kind`: x[e] = logit(p[e]) (sigmoid scores p), or
 * p itself when raw; 0 ok. */
static int route_kind(const char *dir, const char *kind, int raw, const char *spec_json, const float *p, int *sel, float *wts,
                      int k) {
    char err[512];
    Container *ct = ct_open(dir, err, sizeof err);
    if (!ct) {
        CHECK(0, "ct_open: %s", err);
        return -1;
    }
    Arch a = {.hidden = HID};
    BlockLoader L = {ct, &a, 0, err, sizeof err, 0};
    JsonDoc *doc = json_parse(spec_json, strlen(spec_json), err, sizeof err);
    const RouterKind *rk = router_find(kind);
    void *self = calloc(1, rk ? rk->size : 1);
    int rc = -1;
    if (doc && rk && self && rk->load(self, json_root(doc), E, k, &L) == 0) {
        float x[HID];
        for (int e = 0; e < E; e++) x[e] = raw ? p[e] : logit(p[e]);
        rk->route(self, x, 1, sel, wts);
        rc = 0;
    } else {
        CHECK(0, "router load: %s", err);
    }
    if (rk && self) rk->free(self);
    free(self);
    json_free(doc);
    ct_close(ct);
    return rc;
}

static int route_one(const char *dir, const char *spec_json, const float *p, int *sel, float *wts, int k) {
    return route_kind(dir, "sigmoid_group", 0, spec_json, p, sel, wts, k);
}

/* gpt-oss: logits W x + b, their top k (ties to the lower index), softmax over those k alone. */
static void test_topk_softmax(const char *dir) {
    const float x[E] = {1, 3, 2, 3, 0, -1, 2.5f, 0}, bias[E] = {0, 0, 1.5f, 0, 0, 0, 0, 0};
    const char *spec = "{\"kind\":\"topk_softmax\",\"tensors\":{\"weight\":\"w\",\"bias\":\"b\"}}";
    int sel[3];
    float w[3];
    if (write_router_container(dir, bias) || route_kind(dir, "topk_softmax", 1, spec, x, sel, w, 3)) return;
    const double z = exp(3.5) + 2 * exp(3.0);
    CHECK(sel[0] == 2 && sel[1] == 1 && sel[2] == 3, "top-3 of biased logits, ties to the lower index: %d %d %d", sel[0], sel[1],
          sel[2]);
    CHECK(fabs(w[0] - exp(3.5) / z) < 1e-6 && fabs(w[1] - exp(3.0) / z) < 1e-6 && fabs(w[2] - w[1]) < 1e-7,
          "softmax over the chosen logits: %g %g %g", w[0], w[1], w[2]);
}

void test_router(void) {
    char dir[] = "/tmp/coli_router_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    /* groups of two: {0.95, 0.05} (best single expert, top-2 sum 1.0), {0.6, 0.6} (1.2),
     * {0.55, 0.5} (1.05), {0.1, 0.1} (0.2) */
    const float p[E] = {0.95f, 0.05f, 0.6f, 0.6f, 0.55f, 0.5f, 0.1f, 0.1f};
    const float nobias[E] = {0}, bias[E] = {0, 0, 0, 0, 0, 0.3f, 0, 0};
    const char *spec = "{\"kind\":\"sigmoid_group\",\"groups\":4,\"topk_group\":2,\"renorm\":true,\"scale\":2.5,"
                       "\"tensors\":{\"weight\":\"w\",\"bias\":\"b\"}}";
    int sel[3];
    float w[3];
    if (write_router_container(dir, nobias) || route_one(dir, spec, p, sel, w, 2)) return;
    /* by top-2 sums groups 1 and 2 are eligible: expert 0 (the highest score) is not */
    CHECK(sel[0] != 0 && sel[1] != 0 && ((sel[0] == 2 && sel[1] == 3) || (sel[0] == 3 && sel[1] == 2)),
          "group limit by top-2 sums: picked %d, %d", sel[0], sel[1]);
    CHECK(fabsf(w[0] - 1.25f) < 1e-5f && fabsf(w[1] - 1.25f) < 1e-5f, "renormalised, times 2.5: %g %g", w[0], w[1]);
    /* bias +0.3 on expert 5 lifts its group (0.55 + 0.8 > 1.2) and itself into the top 2; its
     * weight stays its unbiased score */
    if (write_router_container(dir, bias) || route_one(dir, spec, p, sel, w, 2)) return;
    int has5 = sel[0] == 5 || sel[1] == 5, other = sel[0] == 5 ? sel[1] : sel[0];
    float w5 = sel[0] == 5 ? w[0] : w[1];
    CHECK(has5 && other == 2, "bias moves selection: picked %d, %d", sel[0], sel[1]);
    CHECK(fabsf(w5 - 2.5f * 0.5f / (0.5f + 0.6f)) < 1e-5f, "weight from the unbiased score: %g", w5);
    /* one group, no renorm: plain top-k of biased scores, weights = score x scale */
    const char *flat = "{\"kind\":\"sigmoid_group\",\"groups\":1,\"topk_group\":1,\"renorm\":false,\"scale\":1.0,"
                       "\"tensors\":{\"weight\":\"w\",\"bias\":\"b\"}}";
    if (route_one(dir, flat, p, sel, w, 3)) return;
    CHECK(sel[0] == 0 && sel[1] == 5 && (sel[2] == 2 || sel[2] == 3) && fabsf(w[0] - 0.95f) < 1e-5f && fabsf(w[1] - 0.5f) < 1e-5f,
          "ungrouped: %d %d %d (%g %g)", sel[0], sel[1], sel[2], w[0], w[1]);
    test_topk_softmax(dir);
    char path[600];
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/colibri.json", dir);
    unlink(path);
    rmdir(dir);
}
