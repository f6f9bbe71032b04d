/* Incremental KV persistence (kv_log.h, kv_writer.h): base + log replay gives the slot back
 * byte for byte, through rewinds, a windowed ring that wrapped and a fixed (recurrent) state;
 * a torn or damaged record ends the replay at the previous turn; a log beside another base is
 * not applied; the writer thread's files restore the same bytes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kv/kv_log.h"
#include "kv/kv_persist.h"
#include "kv/kv_writer.h"
#include "model/model.h"

#define FP 0x5eedull
#define CTX 24

/* A full layer (4 floats per position), a windowed one (ring of 6) and a fixed state of 8 floats. */
static StateDesc states[3];
static Arch arch(void) {
    Arch a = {0};
    a.vocab = 100;
    a.n_layers = 3;
    a.kv_type = QT_F32;
    states[0] = (StateDesc){16, 0, 1, 0, 0, 0};
    states[1] = (StateDesc){16, 0, 1, 6, 0, 0};
    states[2] = (StateDesc){0, 32, 0, 0, 0, 0};
    a.state = states;
    return a;
}

/* Runs the slot forward to n positions with values derived from (position, token, salt). */
static void grow(KvCache *kv, int n, int salt) {
    for (int j = kv->n; j < n; j++) {
        kv->tokens[j] = (j * 7 + salt) % 100;
        for (int l = 0; l < 2; l++) {
            float *row = (float *)(kv->layer[l].pos + (size_t)(j % kv->layer[l].cap) * 16);
            for (int i = 0; i < 4; i++) row[i] = (float)(l * 1000 + j * 10 + i + salt);
        }
        float *fx = (float *)kv->layer[2].fixed;
        for (int i = 0; i < 8; i++) fx[i] = fx[i] * 0.5f + (float)(j + salt);
    }
    kv->n = n;
}

static int same(const KvCache *x, const KvCache *y) {
    if (x->n != y->n || memcmp(x->tokens, y->tokens, sizeof(int32_t) * (size_t)x->n)) return 0;
    for (int l = 0; l < 2; l++)
        if (memcmp(x->layer[l].pos, y->layer[l].pos, 16 * (size_t)kv_held(x, l))) return 0;
    return !memcmp(x->layer[2].fixed, y->layer[2].fixed, 32);
}

static char dir[256], base[400], logp[400];

/* Base from a first record, then one log record per later turn, as the writer would. */
static void save_turn(KvCache *kv, int n0, off_t *len) {
    KvRecord r;
    char err[600];
    CHECK(kv_record_build(kv, n0, &r) == 0, "build");
    uint64_t sum;
    CHECK(kv_file_sum(base, &sum) == 0, "base sum");
    CHECK(kv_log_append(logp, FP, sum, len, &r, err, sizeof err) == 0, "append: %s", err);
    kv_record_free(&r);
}

static int replay(const Arch *a, KvCache *out, char *note) {
    char err[600];
    uint64_t sum;
    off_t good;
    kv_init(out, a, CTX);
    if (kv_restore(out, a, FP, base, err, sizeof err) != 1) {
        CHECK(0, "base: %s", err);
        return -1;
    }
    CHECK(kv_file_sum(base, &sum) == 0, "sum");
    return kv_log_replay(out, a, FP, sum, logp, &good, note, 200);
}

static void test_round_trips(void) {
    Arch a = arch();
    KvCache kv, back;
    char err[600], note[200];
    kv_init(&kv, &a, CTX);
    grow(&kv, 5, 1);
    CHECK(kv_save(&kv, &a, FP, base, err, sizeof err) == 0, "base: %s", err);
    off_t len = 0;
    grow(&kv, 9, 1);
    save_turn(&kv, 5, &len); /* a plain next turn */
    CHECK(replay(&a, &back, note) == 1 && same(&kv, &back) && !note[0], "one record: '%s'", note);
    kv_free(&back);
    kv.n = 7; /* an edited conversation: cut back, regrown */
    grow(&kv, 12, 2);
    save_turn(&kv, 7, &len);
    grow(&kv, 20, 3); /* the ring (6) wraps: only the last 6 are held */
    save_turn(&kv, 12, &len);
    CHECK(replay(&a, &back, note) == 3 && same(&kv, &back), "rewind + wrapped ring: '%s'", note);
    kv_free(&back);

    /* a torn last record: the slot comes back as of the record before */
    struct stat st;
    stat(logp, &st);
    KvCache prev;
    CHECK(replay(&a, &prev, note) == 3, "again");
    CHECK(truncate(logp, st.st_size - 9) == 0, "truncate");
    CHECK(replay(&a, &back, note) == 2 && back.n == 12 && strstr(note, "cut off"), "torn: %d '%s'", back.n, note);
    struct stat st2;
    stat(logp, &st2);
    CHECK(st2.st_size < st.st_size - 9, "the torn tail was cut off the file");
    kv_free(&back);
    kv_free(&prev);

    /* a flipped byte in a record: replay stops before it */
    FILE *f = fopen(logp, "r+b");
    fseek(f, 40, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 40, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
    CHECK(replay(&a, &back, note) == 0 && back.n == 5 && strstr(note, "corrupt"), "flipped: %d '%s'", back.n, note);
    kv_free(&back);

    /* a new base makes the old log foreign: not applied */
    grow(&kv, 21, 4);
    CHECK(kv_save(&kv, &a, FP, base, err, sizeof err) == 0, "new base");
    CHECK(replay(&a, &back, note) == 0 && same(&kv, &back), "foreign log ignored");
    kv_free(&back);
    kv_free(&kv);
    unlink(logp);
}

static void test_writer(void) {
    Arch a = arch();
    unlink(base);
    KvWriter *w = kv_writer_start(dir, 1, &a, CTX, FP);
    CHECK(w != NULL, "writer");
    CHECK(kv_writer_next_full(w, 0, 1), "no base yet: the first record is whole");
    KvCache kv;
    kv_init(&kv, &a, CTX);
    int sent = 0;
    for (int turn = 0; turn < 6; turn++) { /* what engine_persist_slot does after each turn */
        if (turn == 3) kv.n = 4;           /* one rewind */
        int n0 = turn == 0 ? 0 : (turn == 3 ? 4 : sent);
        grow(&kv, kv.n + 3, turn);
        CHECK(turn == 0 || !kv_writer_next_full(w, 0, kv_record_size(&kv, n0)), "turn %d: a small delta", turn);
        KvRecord r;
        kv_writer_admit(w, 0, n0 == 0, kv_record_size(&kv, n0));
        CHECK(kv_record_build(&kv, n0, &r) == 0 && r.len == kv_record_size(&kv, n0), "build");
        kv_writer_submit(w, 0, r, kv_save_size(&kv));
        sent = kv.n;
    }
    size_t peak;
    unsigned long waits;
    kv_writer_stats(w, &peak, &waits);
    CHECK(peak > 0 && peak <= KV_WRITER_RECORDS * kv_record_max(&a, CTX), "held %zu: within the bound", peak);
    kv_writer_stop(w);
    KvCache back;
    char note[200];
    CHECK(replay(&a, &back, note) == 5 && same(&kv, &back), "writer's base + log restore the slot: '%s'", note);
    kv_free(&back);
    kv_free(&kv);
    unlink(base);
    unlink(logp);
}

void test_kv_log(void) {
    snprintf(dir, sizeof dir, "/tmp/coli_kvlog_XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(base, sizeof base, "%s/.coli_kv", dir);
    snprintf(logp, sizeof logp, "%s/.coli_kv.log", dir);
    test_round_trips();
    test_writer();
    rmdir(dir);
}
