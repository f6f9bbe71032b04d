#include "util/op_prof.h"

#include <stdio.h>
#include <string.h>

#include "util/clock.h"

int prof_enabled, prof_active;

static ProfStats tot;
static ProfOp cur = PROF_LOOP;
static double t_last;

static const char *const NAMES[PROF_COUNT] = {"loop",    "norm", "attn_proj", "attn_kv", "router",
                                              "experts", "mlp",  "head",      "sampler", "sync"};

const char *prof_op_name(ProfOp op) { return (unsigned)op < PROF_COUNT ? NAMES[op] : "?"; }

ProfOp prof_current(void) { return cur; }

ProfOp prof_switch(ProfOp op) {
    const double t = now_ms();
    const ProfOp prev = cur;
    tot.ms[cur] += t - t_last;
    t_last = t;
    cur = op;
    return prev;
}

void prof_add_bytes_to(ProfOp op, uint64_t bytes) { __atomic_fetch_add(&tot.bytes[op], bytes, __ATOMIC_RELAXED); }

void prof_move_ms(ProfOp from, ProfOp to, double ms) {
    tot.ms[from] -= ms;
    tot.ms[to] += ms;
}

void prof_step_begin(void) {
    if (!prof_enabled) return;
    cur = PROF_LOOP;
    t_last = now_ms();
    prof_active = 1;
}

void prof_step_forward(void) {
    if (prof_active) tot.steps++;
}

void prof_step_end(void) {
    if (!prof_active) return;
    prof_switch(PROF_LOOP);
    prof_active = 0;
}

void prof_snapshot(ProfStats *out) {
    if (prof_active) prof_switch(cur);
    *out = tot;
}

void prof_fields(const ProfStats *from, const ProfStats *to, char *buf, size_t n) {
    const uint64_t steps = to->steps - from->steps;
    const double per = steps ? 1.0 / (double)steps : 0.0;
    double total = 0;
    for (int i = 0; i < PROF_COUNT; i++) total += to->ms[i] - from->ms[i];
    size_t at = strlen(buf);
    int w =
        snprintf(buf + at, at < n ? n - at : 0, " prof_steps=%llu prof_token_ms=%.4f", (unsigned long long)steps, total * per);
    if (w > 0) at += (size_t)w;
    for (int i = 0; i < PROF_COUNT; i++) {
        const double ms = (to->ms[i] - from->ms[i]) * per, b = (double)(to->bytes[i] - from->bytes[i]) * per;
        w = snprintf(buf + at, at < n ? n - at : 0, " prof_%s_ms=%.4f prof_%s_bytes=%.0f prof_%s_gbs=%.2f", NAMES[i], ms,
                     NAMES[i], b, NAMES[i], ms > 0 ? b / ms / 1e6 : 0.0);
        if (w > 0) at += (size_t)w;
    }
}
