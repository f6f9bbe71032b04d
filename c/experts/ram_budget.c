#include "experts/ram_budget.h"

#include <stdio.h>

#define GB 1e9

/* A budget in GB rounded up to 0.01, so the value it names always fits. */
static double gb_up(uint64_t b) {
    uint64_t c = (b + 9999999) / 10000000;
    return c / 100.0;
}

/* "1.234 GB", or "12.3 MB" below a gigabyte, in one of eight rotating buffers. */
static const char *human(uint64_t b) {
    static char buf[8][32];
    static int k;
    char *o = buf[k++ & 7];
    if (b >= 1000000000ull) snprintf(o, 32, "%.3f GB", b / GB);
    else snprintf(o, 32, "%.1f MB", b / 1e6);
    return o;
}

int ram_budget_split(const BudgetIn *in, BudgetOut *out, char *err, size_t errlen) {
    *out = (BudgetOut){0};
    const uint64_t fixed = in->dense + in->kv + in->runtime + in->checkpoints + in->grammar + in->persist + in->pass;
    const uint64_t floor = fixed - (in->pass_auto ? in->pass : 0); /* an automatic pass shrinks to fit: not a minimum */
    const int E = in->moe_layers > 0 ? in->experts : 0;
    if (in->cap && !E) {
        snprintf(err, errlen, "--cap %d: this model has no routed experts to cache", in->cap);
        return -1;
    }
    if (in->cap && (in->cap < 1 || in->cap > E)) {
        snprintf(err, errlen, "--cap %d: this model has %d experts per MoE layer; give 1 to %d", in->cap, E, E);
        return -1;
    }
    const uint64_t per_cap = (uint64_t)in->moe_layers * in->slot_bytes; /* one slot in every MoE layer */
    out->streaming = in->ram || in->cap;
    out->cap = E;
    const uint64_t mask_max = in->grammar ? GRAMMAR_MASK_CACHE_MAX : 0;
    if (!out->streaming) {
        out->min_ram = floor + (uint64_t)E * per_cap;
        out->mask_cache = mask_max;
        return 0;
    }
    int want = in->cap ? in->cap : 1;
    out->min_ram = floor + (uint64_t)(E ? want : 0) * per_cap;
    if (in->ram) {
        if (in->ram < out->min_ram) {
            if (in->cap)
                snprintf(err, errlen,
                         "--ram %g GB cannot hold dense %s + kv %s + runtime %s + %d x %d expert slots of "
                         "%s (--cap %d)%s%s; give at least --ram %.2f or a smaller --cap",
                         in->ram / GB, human(in->dense), human(in->kv), human(in->runtime), in->moe_layers, in->cap,
                         human(in->slot_bytes), in->cap, in->pass ? " + prefill pass " : "", in->pass ? human(in->pass) : "",
                         gb_up(out->min_ram));
            else {
                char writer[128] = ""; /* named only with --kv-dir / a longer pass, so the message is unchanged without */
                int w = in->persist ? snprintf(writer, sizeof writer, " + kv writer %s (--kv-dir)", human(in->persist)) : 0;
                if (in->pass)
                    snprintf(writer + w, sizeof writer - (size_t)w, " + prefill pass %s (--prefill-pass)", human(in->pass));
                snprintf(err, errlen,
                         "--ram %g GB cannot hold dense %s + kv %s + runtime %s + checkpoints %s + grammar "
                         "%s%s%s; give at least --ram %.2f (or lower --ctx / --kv-slots)",
                         in->ram / GB, human(in->dense), human(in->kv), human(in->runtime), human(in->checkpoints),
                         human(in->grammar), writer, E ? " + one expert slot per MoE layer" : "", gb_up(out->min_ram));
            }
            return -1;
        }
        /* elastic: what the budget has beyond its minimum pays for it first, in a small share */
        uint64_t spare = (in->ram - out->min_ram) / GRAMMAR_MASK_CACHE_SHARE;
        out->mask_cache = spare < mask_max ? spare : mask_max;
        if (E && !in->cap) {
            uint64_t c = (in->ram - fixed - out->mask_cache) / per_cap;
            out->cap = c > (uint64_t)E ? E : (int)c;
        }
    } else out->mask_cache = mask_max;
    if (in->cap) out->cap = in->cap;
    out->cache = E ? (uint64_t)out->cap * per_cap : 0;
    if (!E) out->cap = 0;
    return 0;
}

int ram_budget_pass(const BudgetIn *in, const BudgetOut *out, int want, int batch, uint64_t pos_bytes, int *limited) {
    *limited = 0;
    if (!in->ram || want <= batch || !pos_bytes) return want;
    const uint64_t beyond = in->ram > out->min_ram + out->mask_cache ? in->ram - out->min_ram - out->mask_cache : 0;
    const uint64_t spare = beyond / 2;                          /* the expert cache keeps the other half */
    const uint64_t extra = spare / pos_bytes / (uint64_t)batch; /* whole batches past the first */
    if (extra >= (uint64_t)(want / batch - 1)) return want;
    *limited = 1;
    return (int)(extra + 1) * batch;
}
