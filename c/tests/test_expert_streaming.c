/* The RAM budget split, the I/O pool and .coli_usage, without a model. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "experts/io_pool.h"
#include "experts/ram_budget.h"
#include "experts/usage.h"

/* 40 MB fixed, 4 layers x 1 MB slots, in a 100 MB budget. */
static BudgetIn budget_100mb(void) {
    return (BudgetIn){.ram = 100000000,
                      .dense = 30000000,
                      .kv = 6000000,
                      .runtime = 4000000,
                      .moe_layers = 4,
                      .experts = 64,
                      .slot_bytes = 1000000};
}

static void test_budget(void) {
    char err[512];
    BudgetOut o;
    /* 40 MB fixed, 4 layers x 1 MB slots: 100 MB leaves 60 MB = 15 slots per layer */
    BudgetIn in = budget_100mb();
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0, "%s", err);
    CHECK(o.streaming && o.cap == 15 && o.cache == 60000000ull, "cap %d cache %llu", o.cap, (unsigned long long)o.cache);
    CHECK(o.min_ram == 44000000ull, "min_ram %llu", (unsigned long long)o.min_ram);
    in.ram = 10000000000ull; /* plenty: every expert, never more */
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.cap == 64 && o.cache == 256000000ull, "cap %d", o.cap);
    in.ram = 43999999; /* one byte short of cap 1 */
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == -1, "a budget below cap 1 must be refused");
    CHECK(strstr(err, "--ram 0.05") != NULL, "the refusal names the smallest budget: %s", err);
    in.ram = 44000000;
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.cap == 1, "exactly cap 1 fits");
    in.cap = 20; /* an explicit cap beyond the budget */
    in.ram = 100000000;
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == -1 && strstr(err, "--cap 20"), "%s", err);
    in.cap = 3;
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.cap == 3 && o.cache == 12000000ull, "cap %d", o.cap);
    in.cap = 65;
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == -1 && strstr(err, "1 to 64"), "%s", err);
    in.ram = 0; /* --cap alone streams without a budget */
    in.cap = 2;
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.streaming && o.cap == 2, "cap %d", o.cap);
    in.cap = 0; /* neither: resident */
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && !o.streaming && o.cap == 64 && o.cache == 0, "resident");
    BudgetIn dense = {.ram = 50000000, .dense = 30000000, .kv = 6000000, .runtime = 4000000};
    CHECK(ram_budget_split(&dense, &o, err, sizeof err) == 0 && o.cap == 0 && o.cache == 0, "no MoE: no cache");
    dense.cap = 1;
    CHECK(ram_budget_split(&dense, &o, err, sizeof err) == -1 && strstr(err, "no routed experts"), "%s", err);
    dense.cap = 0;
    dense.ram = 39000000;
    CHECK(ram_budget_split(&dense, &o, err, sizeof err) == -1 && strstr(err, "--ram 0.04"), "%s", err);
    /* checkpoints and the grammar are fixed; the mask cache takes 1/16 of the spare budget */
    BudgetIn g = budget_100mb();
    g.checkpoints = 8000000;
    g.grammar = 2000000;
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == 0 && o.min_ram == 54000000ull, "min_ram %llu",
          (unsigned long long)o.min_ram);
    /* spare 46 MB: mask cache 2.875 MB; 100 - 50 - 2.875 = 47.1 MB: 11 slots per layer */
    CHECK(o.mask_cache == 2875000ull && o.cap == 11, "mask %llu cap %d", (unsigned long long)o.mask_cache, o.cap);
    CHECK(50000000ull + o.mask_cache + o.cache <= g.ram, "the split exceeds the budget");
    g.ram = 10000000000ull; /* plenty: the mask cache stops at its bound */
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == 0 && o.mask_cache == GRAMMAR_MASK_CACHE_MAX, "mask bound");
    g.ram = 54000000; /* the minimum: no mask is kept, each is rebuilt on use */
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == 0 && o.mask_cache == 0 && o.cap == 1, "at the minimum");
    g.ram = 53999999;
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == -1 && strstr(err, "checkpoints 8.0 MB") && strstr(err, "grammar 2.0 MB") &&
              strstr(err, "--ram 0.06"),
          "%s", err);
    g.persist = 5000000; /* --kv-dir: the writer's bound is fixed too, and named when it does not fit */
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == -1 && strstr(err, "kv writer 5.0 MB (--kv-dir)") &&
              strstr(err, "--ram 0.06"),
          "%s", err);
    g.ram = 59000000;
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == 0 && o.min_ram == 59000000ull && o.cap == 1, "min_ram %llu",
          (unsigned long long)o.min_ram);
    g.persist = 0;
    g.grammar = 0;
    g.ram = 0; /* no tokenizer: no grammar, no masks */
    CHECK(ram_budget_split(&g, &o, err, sizeof err) == 0 && o.mask_cache == 0, "no grammar: no mask cache");
}

/* The prefill pass takes at most half of what the budget has beyond its minimum, in whole
 * batches past the first; without a budget it is what was asked. */
static void test_budget_pass(void) {
    char err[512];
    BudgetOut o;
    BudgetIn in = budget_100mb();
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.min_ram == 44000000ull, "%s", err);
    int limited = 0;
    /* 56 MB spare: 28 MB for the pass; 1 MB a batch of 8 at 125 kB a position: 28 more batches */
    CHECK(ram_budget_pass(&in, &o, 4096, 8, 125000, &limited) == 29 * 8 && limited, "budget-limited pass");
    CHECK(ram_budget_pass(&in, &o, 128, 8, 125000, &limited) == 128 && !limited, "a pass that fits");
    CHECK(ram_budget_pass(&in, &o, 8, 8, 125000, &limited) == 8 && !limited, "one batch");
    in.pass = (uint64_t)(29 * 8 - 8) * 125000;
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.min_ram == 72000000ull && o.cap == 8, "cap %d min %llu", o.cap,
          (unsigned long long)o.min_ram);
    in.pass_auto = 1; /* sized from the spare: the minimum stays the one-batch one */
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == 0 && o.min_ram == 44000000ull && o.cap == 8, "cap %d min %llu", o.cap,
          (unsigned long long)o.min_ram);
    in.pass_auto = 0;
    in.ram = 50000000; /* a pass the budget cannot hold is named in the refusal */
    CHECK(ram_budget_split(&in, &o, err, sizeof err) == -1 && strstr(err, "prefill pass 28.0 MB"), "%s", err);
    in.ram = 0;
    CHECK(ram_budget_pass(&in, &o, 4096, 8, 125000, &limited) == 4096 && !limited, "no budget: as asked");
}

static void test_pool(void) {
    char path[] = "/tmp/coli_io_test_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    enum { N = 3 * 4096 + 100 };
    unsigned char *data = malloc(N);
    for (int i = 0; i < N; i++) data[i] = (unsigned char)(i * 7 + 3);
    CHECK(write(fd, data, N) == N, "write");
    int fdd = open(path, O_RDONLY | O_DIRECT);
    IoPool p;
    CHECK(io_pool_start(&p, 3) == 0, "start");
    IoReq r[8];
    unsigned char *buf[8];
    for (int i = 0; i < 8; i++) {
        memset(&r[i], 0, sizeof r[i]);
        CHECK(posix_memalign((void **)&buf[i], 4096, 4 * 4096) == 0, "memalign");
        /* the last page is short: an aligned request past the end still gets what exists */
        r[i].nseg = 1;
        r[i].seg[0] = (IoSeg){
            fdd, fd, (uint64_t)(i % 4) * 4096, 4 * 4096 - (size_t)(i % 4) * 4096, (size_t)N - (size_t)(i % 4) * 4096, buf[i]};
        io_submit(&p, &r[i], i % 2);
    }
    io_promote(&p, &r[7]);
    for (int i = 0; i < 8; i++) {
        CHECK(io_wait(&p, &r[i]) == 0, "read %d: %s", i, strerror(r[i].err));
        CHECK(memcmp(buf[i], data + (i % 4) * 4096, (size_t)N - (size_t)(i % 4) * 4096) == 0, "bytes of read %d", i);
    }
    IoReq past = {.nseg = 1, .seg = {{-1, fd, 0, 2 * N, 2 * N, buf[0]}}};
    io_submit(&p, &past, 0);
    CHECK(io_wait(&p, &past) == EIO, "a file shorter than needed is an error");
    io_pool_stop(&p);
    for (int i = 0; i < 8; i++) free(buf[i]);
    free(data);
    if (fdd >= 0) close(fdd);
    close(fd);
    unlink(path);
}

static void test_usage(void) {
    char dir[] = "/tmp/coli_usage_test_XXXXXX", path[256], warn[600], err[600];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/.coli_usage", dir);
    Usage u, v;
    CHECK(usage_init(&u, 2, 3) == 0, "init");
    uint32_t turn[6] = {1, 0, 5, 2, 2, 0};
    usage_add(&u, turn);
    usage_add(&u, turn);
    CHECK(usage_save(&u, path, err, sizeof err) == 0, "%s", err);
    usage_init(&v, 2, 3);
    CHECK(usage_load(&v, path, warn, sizeof warn) == 1, "%s", warn);
    CHECK(v.turns == 2 && v.counts[2] == 10 && v.counts[3] == 4, "turns %llu", (unsigned long long)v.turns);
    usage_free(&v);
    usage_init(&v, 2, 4); /* another geometry is ignored with the reason */
    CHECK(usage_load(&v, path, warn, sizeof warn) == -1 && strstr(warn, "2 x 4"), "%s", warn);
    usage_free(&v);
    FILE *f = fopen(path, "w");
    fputs("{\"version\": 1, \"layers\": 2, \"experts\": 3, \"counts\": [[1, 2", f);
    fclose(f);
    usage_init(&v, 2, 3);
    CHECK(usage_load(&v, path, warn, sizeof warn) == -1 && v.counts[0] == 0, "a torn file is ignored");
    usage_free(&v);
    uint32_t big[6] = {0};
    u.counts[0] = USAGE_MAX_COUNT; /* bounded: one count past the limit halves them all */
    big[0] = 2;
    usage_add(&u, big);
    CHECK(u.counts[0] == (USAGE_MAX_COUNT + 2) / 2 && u.counts[2] == 5, "halved %llu", (unsigned long long)u.counts[0]);
    usage_free(&u);
    unlink(path);
    rmdir(dir);
}

void test_expert_streaming(void) {
    test_budget();
    test_budget_pass();
    test_pool();
    test_usage();
}
