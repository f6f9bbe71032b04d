/* model_load with an arbitrary colibri.json beside the fixture's real shard: the container
 * manifest (c/io/container.c) and the architecture reader (c/model/model_load.c) both see the input. */
#include "harness.h"
#include "model/model.h"

#define SHARD "model-00001-of-00001.safetensors"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    size_t n;
    char *shard = fuzz_slurp(FUZZ_ASSETS "/" SHARD, &n);
    fuzz_write(fuzz_tmpdir(), SHARD, shard, n);
    free(shard);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(fuzz_tmpdir(), "colibri.json", data, size);
    Model m;
    char err[1024] = "";
    if (model_load(&m, fuzz_tmpdir(), err, sizeof err)) {
        if (!err[0]) abort();
        return 0;
    }
    model_free(&m);
    return 0;
}
