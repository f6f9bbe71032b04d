#include "experts/usage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/json.h"

#define USAGE_MAX_FILE (64u << 20)

int usage_init(Usage *u, int layers, int experts) {
    memset(u, 0, sizeof *u);
    u->layers = layers;
    u->experts = experts;
    u->counts = calloc((size_t)layers * experts + 1, sizeof(uint64_t));
    return u->counts ? 0 : -1;
}

void usage_free(Usage *u) {
    free(u->counts);
    memset(u, 0, sizeof *u);
}

int usage_load(Usage *u, const char *path, char *warn, size_t warnlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *text = malloc(USAGE_MAX_FILE + 1);
    size_t n = text ? fread(text, 1, USAGE_MAX_FILE + 1, f) : 0;
    fclose(f);
    if (!text || n > USAGE_MAX_FILE) {
        free(text);
        snprintf(warn, warnlen, "%s: too large or no memory; ignored", path);
        return -1;
    }
    char jerr[200];
    JsonDoc *d = json_parse(text, n, jerr, sizeof jerr);
    free(text);
    if (!d) {
        snprintf(warn, warnlen, "%s: not valid JSON (%s); ignored", path, jerr);
        return -1;
    }
    const JsonValue *r = json_root(d), *c = json_get(r, "counts");
    int rc = -1;
    if (json_get_int(r, "version", -1) != 1) snprintf(warn, warnlen, "%s: not version 1; ignored", path);
    else if (json_get_int(r, "layers", -1) != u->layers || json_get_int(r, "experts", -1) != u->experts)
        snprintf(warn, warnlen, "%s: written for %lld MoE layers x %lld experts, this model has %d x %d; ignored", path,
                 (long long)json_get_int(r, "layers", -1), (long long)json_get_int(r, "experts", -1), u->layers, u->experts);
    else if (!c || c->type != JSON_ARR || (int)c->len != u->layers)
        snprintf(warn, warnlen, "%s: counts is not one list per MoE layer; ignored", path);
    else {
        rc = 1;
        for (int l = 0; l < u->layers && rc == 1; l++) {
            const JsonValue *row = &c->items[l];
            if (row->type != JSON_ARR || (int)row->len != u->experts) rc = -1;
            for (int e = 0; rc == 1 && e < u->experts; e++)
                if (!row->items[e].is_int || row->items[e].i < 0) rc = -1;
                else u->counts[(size_t)l * u->experts + e] = (uint64_t)row->items[e].i;
        }
        if (rc < 0) {
            snprintf(warn, warnlen, "%s: a count is not a non-negative integer; ignored", path);
            memset(u->counts, 0, sizeof(uint64_t) * (size_t)u->layers * u->experts);
        }
        int64_t t = json_get_int(r, "turns", 0);
        u->turns = t > 0 ? (uint64_t)t : 0;
    }
    json_free(d);
    return rc;
}

void usage_add(Usage *u, const uint32_t *turn) {
    size_t n = (size_t)u->layers * u->experts;
    int halve = 0;
    for (size_t i = 0; i < n; i++) halve |= (u->counts[i] += turn[i]) > USAGE_MAX_COUNT;
    if (halve)
        for (size_t i = 0; i < n; i++) u->counts[i] /= 2;
    u->turns++;
}

int usage_save(const Usage *u, const char *path, char *err, size_t errlen) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    int bad = fprintf(f, "{\"version\": 1, \"layers\": %d, \"experts\": %d, \"turns\": %llu, \"counts\": [", u->layers,
                      u->experts, (unsigned long long)u->turns) < 0;
    for (int l = 0; l < u->layers && !bad; l++) {
        bad |= fputs(l ? ", [" : "[", f) < 0;
        for (int e = 0; e < u->experts && !bad; e++)
            bad |= fprintf(f, e ? ", %llu" : "%llu", (unsigned long long)u->counts[(size_t)l * u->experts + e]) < 0;
        bad |= fputc(']', f) < 0;
    }
    bad |= fputs("]}\n", f) < 0;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
