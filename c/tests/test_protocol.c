/* Frame parsing, including hostile headers, and the buffered reader over a pipe. */
#include <string.h>
#include <unistd.h>
#include <stdlib.h>

#include "check.h"
#include "io/json.h"
#include "engine/protocol.h"

static int parse(const char *s, Frame *f, char *err) { return frame_parse(s, strlen(s), f, err, 256); }

void test_protocol(void) {
    Frame f;
    char err[256];
    CHECK(parse("SUBMIT r1 5 slot=2 temp=0.7 top_p=0.9 top_k=40 min_p=0.05 seed=42 max_tokens=16 ids=1", &f, err) == 0, "%s",
          err);
    CHECK(f.kind == FR_SUBMIT && !strcmp(f.id, "r1") && f.payload_len == 5 && f.slot == 2 && f.ids == 1, "fields");
    CHECK(f.sp.top_k == 40 && f.has_seed && f.sp.seed == 42 && f.max_tokens == 16 && f.sp.temperature > 0.69f, "sampling");
    CHECK(parse("SUBMIT r2 0", &f, err) == 0 && f.max_tokens == -1 && f.sp.top_p == 1.0f && f.parse_special &&
              f.pen.repeat == 1.0f && f.pen.last_n == 64 && !f.pen.frequency,
          "defaults");
    CHECK(parse("SUBMIT r2 0 repeat_penalty=1.3 frequency_penalty=-0.5 presence_penalty=2 repeat_last_n=-1", &f, err) == 0 &&
              f.pen.repeat > 1.29f && f.pen.frequency == -0.5f && f.pen.presence == 2.0f && f.pen.last_n == -1,
          "penalties: %s", err);
    CHECK(parse("SUBMIT r3 20 literal=4", &f, err) == 0 && f.literal == 4 && !f.ids, "literal: %s", err);
    CHECK(parse("SUBMIT r4 20 grammar=10 literal=4", &f, err) == 0 && f.grammar == 10 && f.literal == 4, "grammar: %s", err);
    CHECK(parse("SUBMIT r5 20 grammar=12 ids=1", &f, err) == 0 && f.grammar == 12 && f.ids, "grammar ids: %s", err);
    CHECK(parse("STOP r1", &f, err) == 0 && f.kind == FR_STOP, "STOP");
    CHECK(parse("CANCEL abc-9", &f, err) == 0 && f.kind == FR_CANCEL, "CANCEL");
    struct {
        const char *line, *needle;
    } bad[] = {
        {"", "empty"},
        {"SUBMIT", "request id"},
        {"SUBMIT r1", "payload byte count"},
        {"SUBMIT r1 -5", "payload byte count"},
        {"SUBMIT r1 99999999999", "payload byte count"},
        {"SUBMIT r1 5 slot=16", "bad value"},
        {"SUBMIT r1 5 repeat_penalty=-1", "bad value"},
        {"SUBMIT r1 5 repeat_last_n=-2", "bad value"},
        {"SUBMIT r1 5 temp=abc", "bad value"},
        {"SUBMIT r1 5 top_p=1.5", "bad value"},
        {"SUBMIT r1 5 seed=-1", "bad value"},
        {"SUBMIT r1 5 color=red", "unknown SUBMIT option"},
        {"SUBMIT r1 5 novalue", "not key=value"},
        {"SUBMIT r1 5 literal=6", "literal=6 needs a text payload"},
        {"SUBMIT r1 5 literal=2 ids=1", "needs a text payload"},
        {"SUBMIT r1 5 literal=0", "bad value"},
        {"SUBMIT r1 5 grammar=0", "bad value"},
        {"SUBMIT r1 5 grammar=6", "grammar=6 needs a payload"},
        {"SUBMIT r1 8 grammar=5 literal=4", "literal=4 needs a text payload"},
        {"SUBMIT bad/id 5", "request id"},
        {"STOP r1 extra", "only a request id"},
        {"HELLO r1", "unknown frame"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = parse(bad[i].line, &f, err);
        CHECK(rc == -1 && strstr(err, bad[i].needle), "'%s' -> rc %d '%s'", bad[i].line, rc, err);
    }
    char nul[] = "SUBMIT r\0x 1";
    CHECK(frame_parse(nul, sizeof nul - 1, &f, err, sizeof err) == -1 && strstr(err, "NUL"), "NUL in header");
    char *longline = malloc(PROTO_MAX_LINE + 10);
    memset(longline, 'a', PROTO_MAX_LINE + 9);
    longline[PROTO_MAX_LINE + 9] = 0;
    CHECK(parse(longline, &f, err) == -1 && strstr(err, "longer"), "overlong header");
    free(longline);

    /* reader: frames split across writes, payload with newlines, garbage between frames */
    int fds[2];
    if (pipe(fds)) {
        CHECK(0, "pipe");
        return;
    }
    FrameReader r;
    reader_init(&r, fds[0]);
    char *payload;
    const char *part1 = "SUBMIT a 6\nhel", *part2 = "l\noGARBAGE x\nSTOP a\n";
    if (write(fds[1], part1, strlen(part1)) < 0) CHECK(0, "write");
    reader_fill(&r, 100);
    CHECK(reader_next(&r, &f, &payload, err, sizeof err) == 0, "incomplete payload waits");
    if (write(fds[1], part2, strlen(part2)) < 0) CHECK(0, "write");
    reader_fill(&r, 100);
    int rc = reader_next(&r, &f, &payload, err, sizeof err);
    CHECK(rc == 1 && payload && !memcmp(payload, "hell\no", 6), "payload across writes");
    free(payload);
    rc = reader_next(&r, &f, &payload, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "unknown frame"), "garbage line reported: %s", err);
    rc = reader_next(&r, &f, &payload, err, sizeof err);
    CHECK(rc == 1 && f.kind == FR_STOP, "frame after garbage still read");
    free(payload);
    close(fds[1]);
    reader_fill(&r, 100);
    CHECK(r.eof, "EOF seen");
    reader_free(&r);
    close(fds[0]);
}

void test_json(void) {
    char err[256];
    const char *good = "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\ud83d\\ude00\\n\"], \"b\": {\"c\": 9007199254740993}}";
    JsonDoc *d = json_parse(good, strlen(good), err, sizeof err);
    CHECK(d != NULL, "valid JSON: %s", err);
    if (d) {
        const JsonValue *a = json_get(json_root(d), "a");
        CHECK(a && a->len == 5 && a->items[1].num == -2500 && a->items[2].boolean, "array values");
        CHECK(a && !strcmp(a->items[4].str, "x\xc3\xa9\xf0\x9f\x98\x80\n"), "escapes decode to UTF-8");
        CHECK(json_get_int(json_get(json_root(d), "b"), "c", 0) == 9007199254740993LL, "int64 exact");
        json_free(d);
    }
    const char *bad[] = {"", "{", "{\"a\" 1}", "[1,]", "\"\\ud800\"", "\"abc", "01x", "{\"a\":1} x", "\"a\x01\"", "nul"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        JsonDoc *b = json_parse(bad[i], strlen(bad[i]), err, sizeof err);
        CHECK(b == NULL && strstr(err, "JSON error"), "bad JSON #%zu accepted", i);
        json_free(b);
    }
}
