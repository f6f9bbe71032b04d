#include "engine/protocol.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/grow.h"

static int valid_id(const char *s, size_t n) {
    if (n == 0 || n > PROTO_MAX_ID) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

static int parse_long(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = (float)v;
    return 0;
}

static int parse_flag(const char *s, int *out) {
    if (strcmp(s, "0") == 0) {
        *out = 0;
        return 0;
    }
    if (strcmp(s, "1") == 0) {
        *out = 1;
        return 0;
    }
    return -1;
}

/* Applies one key=value option of a SUBMIT header. */
static int submit_option(Frame *f, const char *key, const char *val, char *err, size_t errlen) {
    long long n;
    int bad = 0;
    if (!strcmp(key, "slot")) {
        bad = parse_long(val, 0, 15, &n);
        f->slot = (int)n;
    } else if (!strcmp(key, "max_tokens")) {
        bad = parse_long(val, -1, 1 << 30, &n);
        f->max_tokens = (int)n;
    } else if (!strcmp(key, "top_k")) {
        bad = parse_long(val, 0, 1 << 30, &n);
        f->sp.top_k = (int)n;
    } else if (!strcmp(key, "seed")) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(val, &end, 10);
        bad = errno || end == val || *end || val[0] == '-';
        f->sp.seed = s;
        f->has_seed = 1;
    } else if (!strcmp(key, "temp")) bad = parse_float(val, 0, 100, &f->sp.temperature);
    else if (!strcmp(key, "top_p")) bad = parse_float(val, 0, 1, &f->sp.top_p);
    else if (!strcmp(key, "min_p")) bad = parse_float(val, 0, 1, &f->sp.min_p);
    else if (!strcmp(key, "repeat_penalty")) bad = parse_float(val, 0, 100, &f->pen.repeat);
    else if (!strcmp(key, "frequency_penalty")) bad = parse_float(val, -100, 100, &f->pen.frequency);
    else if (!strcmp(key, "presence_penalty")) bad = parse_float(val, -100, 100, &f->pen.presence);
    else if (!strcmp(key, "repeat_last_n")) {
        bad = parse_long(val, -1, 1 << 30, &n);
        f->pen.last_n = (int)n;
    } else if (!strcmp(key, "ids")) bad = parse_flag(val, &f->ids);
    else if (!strcmp(key, "logits")) bad = parse_flag(val, &f->logits);
    else if (!strcmp(key, "routing")) bad = parse_flag(val, &f->routing);
    else if (!strcmp(key, "progress")) bad = parse_flag(val, &f->progress);
    else if (!strcmp(key, "special")) bad = parse_flag(val, &f->parse_special);
    else if (!strcmp(key, "add_special")) bad = parse_flag(val, &f->add_special);
    else if (!strcmp(key, "render_special")) bad = parse_flag(val, &f->render_special);
    else if (!strcmp(key, "ignore_eos")) bad = parse_flag(val, &f->ignore_eos);
    else if (!strcmp(key, "fit")) bad = parse_flag(val, &f->fit);
    else if (!strcmp(key, "logprobs")) bad = parse_flag(val, &f->logprobs);
    else if (!strcmp(key, "top_logprobs")) {
        bad = parse_long(val, 0, 20, &n);
        f->top_logprobs = (int)n;
    } else if (!strcmp(key, "grammar")) {
        bad = parse_long(val, 1, PROTO_MAX_PAYLOAD, &n);
        f->grammar = (size_t)n;
    } else if (!strcmp(key, "literal")) {
        bad = parse_long(val, 1, PROTO_MAX_PAYLOAD, &n);
        f->literal = (size_t)n;
    } else {
        snprintf(err, errlen, "unknown SUBMIT option '%s'", key);
        return -1;
    }
    if (bad) snprintf(err, errlen, "bad value '%s' for SUBMIT option '%s'", val, key);
    return bad ? -1 : 0;
}

int frame_parse(const char *line, size_t len, Frame *f, char *err, size_t errlen) {
    char buf[PROTO_MAX_LINE + 1];
    memset(f, 0, sizeof(*f));
    strcpy(f->id, "-");
    f->max_tokens = -1;
    f->parse_special = 1;
    f->sp.top_p = 1.0f;
    f->pen.repeat = 1.0f;
    f->pen.last_n = 64; /* llama.cpp's window */
    if (len > PROTO_MAX_LINE) {
        snprintf(err, errlen, "frame header longer than %d bytes", PROTO_MAX_LINE);
        return -1;
    }
    if (memchr(line, 0, len)) {
        snprintf(err, errlen, "NUL byte in frame header");
        return -1;
    }
    memcpy(buf, line, len);
    buf[len] = 0;
    char *save = NULL, *verb = strtok_r(buf, " ", &save), *id = verb ? strtok_r(NULL, " ", &save) : NULL;
    if (!verb) {
        snprintf(err, errlen, "empty frame header");
        return -1;
    }
    if (!id || !valid_id(id, strlen(id))) {
        snprintf(err, errlen, "frame '%s' needs a request id of 1-%d characters [A-Za-z0-9._-]", verb, PROTO_MAX_ID);
        return -1;
    }
    strcpy(f->id, id);
    if (!strcmp(verb, "STOP") || !strcmp(verb, "CANCEL")) {
        f->kind = verb[0] == 'S' ? FR_STOP : FR_CANCEL;
        if (strtok_r(NULL, " ", &save)) {
            snprintf(err, errlen, "%s takes only a request id", verb);
            return -1;
        }
        return 0;
    }
    if (strcmp(verb, "SUBMIT") != 0) {
        snprintf(err, errlen, "unknown frame '%s'", verb);
        return -1;
    }
    f->kind = FR_SUBMIT;
    char *nb = strtok_r(NULL, " ", &save);
    long long n;
    if (!nb || parse_long(nb, 0, PROTO_MAX_PAYLOAD, &n)) {
        snprintf(err, errlen, "SUBMIT needs a payload byte count between 0 and %u", PROTO_MAX_PAYLOAD);
        return -1;
    }
    f->payload_len = (size_t)n;
    for (char *kv; (kv = strtok_r(NULL, " ", &save));) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(err, errlen, "SUBMIT option '%s' is not key=value", kv);
            return -1;
        }
        *eq = 0;
        if (submit_option(f, kv, eq + 1, err, errlen)) return -1;
    }
    if (f->grammar > f->payload_len) {
        snprintf(err, errlen, "SUBMIT grammar=%zu needs a payload of at least that many bytes", f->grammar);
        return -1;
    }
    if (f->literal && (f->ids || f->literal > f->payload_len - f->grammar)) {
        snprintf(err, errlen, "SUBMIT literal=%zu needs a text payload (ids=0) of at least that many bytes", f->literal);
        return -1;
    }
    return 0;
}

void reader_init(FrameReader *r, int fd) {
    memset(r, 0, sizeof(*r));
    r->fd = fd;
}

void reader_free(FrameReader *r) {
    free(r->buf);
    r->buf = NULL;
}

void reader_fill(FrameReader *r, int timeout_ms) {
    if (r->eof) return;
    struct pollfd p = {r->fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return;
    if (r->cap - r->len < 65536) {
        char *nb = grow_array(r->buf, &r->cap, r->len + 65536, 1, 131072);
        if (nb) r->buf = nb;
        else if (r->len == r->cap) { /* full and cannot grow: reader_next drops the frame that needs the room */ r->oom = 1;
            return;
        }
    }
    ssize_t got = read(r->fd, r->buf + r->len, r->cap - r->len);
    if (got > 0) r->len += (size_t)got;
    else if (got == 0 || (errno != EINTR && errno != EAGAIN)) r->eof = 1;
}

static void consume(FrameReader *r, size_t n) {
    memmove(r->buf, r->buf + n, r->len - n);
    r->len -= n;
}

int reader_next(FrameReader *r, Frame *f, char **payload, char *err, size_t errlen) {
    *payload = NULL;
    if (r->skip) {
        size_t n = r->skip < r->len ? r->skip : r->len;
        consume(r, n);
        r->skip -= n;
        if (r->skip) return 0;
    }
    char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
    if (!nl) {
        if (r->len > PROTO_MAX_LINE) { /* no newline in sight: drop the garbage */
            r->len = 0;
            memset(f, 0, sizeof(*f));
            strcpy(f->id, "-");
            snprintf(err, errlen, "frame header longer than %d bytes", PROTO_MAX_LINE);
            return -1;
        }
        return 0;
    }
    size_t hl = (size_t)(nl - r->buf);
    if (frame_parse(r->buf, hl, f, err, errlen)) {
        consume(r, hl + 1);
        r->skip = f->payload_len; /* a SUBMIT with a readable count but bad options: drop its payload too */
        return -1;
    }
    size_t need = hl + 1 + f->payload_len;
    if (r->len < need) {
        if (r->eof) {
            consume(r, r->len);
            snprintf(err, errlen, "input ended inside a SUBMIT payload");
            return -1;
        }
        if (r->oom) { /* the buffer is full and this frame is longer: discard it as it arrives */
            r->oom = 0;
            r->skip = need - r->len;
            consume(r, r->len);
            snprintf(err, errlen, "no memory to hold a %zu-byte payload", f->payload_len);
            return -2;
        }
        return 0;
    }
    char *p = malloc(f->payload_len + 1);
    if (!p) {
        consume(r, need);
        snprintf(err, errlen, "no memory to hold a %zu-byte payload", f->payload_len);
        return -2;
    }
    memcpy(p, r->buf + hl + 1, f->payload_len);
    p[f->payload_len] = 0;
    consume(r, need);
    *payload = p;
    return 1;
}

void emit_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
}

void emit_data(const char *id, int token, const char *bytes, size_t n) {
    fprintf(stdout, "DATA %s %d %zu\n", id, token, n);
    fwrite(bytes, 1, n, stdout);
    fflush(stdout);
}

void emit_error(const char *id, const char *type, const char *msg) {
    size_t n = strlen(msg);
    fprintf(stdout, "ERROR %s %s %zu\n", id, type, n);
    fwrite(msg, 1, n, stdout);
    fflush(stdout);
}

void emit_blob(const char *head, const void *bytes, size_t n) {
    fputs(head, stdout);
    fwrite(bytes, 1, n, stdout);
    fflush(stdout);
}
