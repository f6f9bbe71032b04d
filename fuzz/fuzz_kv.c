/* kv_restore on an arbitrary KV state file, into a cache sized for the fixture model as the
 * engine sizes it (kv_init in c/model/kv.c, from the layers' state descriptors), with the fixture's fingerprint so the fuzzer can
 * get past the header into the token and tensor reads. */
#include "harness.h"
#include "kv/kv_persist.h"
#include "model/model.h"

#define CTX 64
static Model model;
static uint64_t fp;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char err[512];
    if (model_load(&model, FUZZ_ASSETS, err, sizeof err)) {
        fprintf(stderr, "fuzz: %s\n", err);
        abort();
    }
    fp = kv_fingerprint(FUZZ_ASSETS);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const Arch *a = &model.a;
    KvCache kv;
    if (kv_init(&kv, a, CTX)) abort();
    const char *path = fuzz_write(fuzz_tmpdir(), ".coli_kv", data, size);
    char err[512] = "";
    int rc = kv_restore(&kv, a, fp, path, err, sizeof err);
    if (rc < 0 && !err[0]) abort();
    if (rc == 1) {
        if (kv.n < 0 || kv.n > CTX) abort();
        for (int i = 0; i < kv.n; i++)
            if (kv.tokens[i] < 0 || kv.tokens[i] >= a->vocab) abort();
    }
    kv_free(&kv);
    return 0;
}
