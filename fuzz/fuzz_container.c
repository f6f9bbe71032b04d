/* model_load with the fixture's real colibri.json and an arbitrary shard: the safetensors
 * header, the "colibri.tensors" storage table and every shape check see the input. */
#include "harness.h"
#include "model/model.h"

#define SHARD "model-00001-of-00001.safetensors"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    size_t n;
    char *man = fuzz_slurp(FUZZ_ASSETS "/colibri.json", &n);
    fuzz_write(fuzz_tmpdir(), "colibri.json", man, n);
    free(man);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(fuzz_tmpdir(), SHARD, data, size);
    Model m;
    char err[1024] = "";
    if (model_load(&m, fuzz_tmpdir(), err, sizeof err)) {
        if (!err[0]) abort();
        return 0;
    }
    /* a loaded model's trunk matrices must lie inside the mapping: touch their last bytes (the
     * layers' blocks keep their matrices private; they come through the same bl_mat_named checks) */
    volatile unsigned sum = m.embed.data[(size_t)m.embed.rows * m.embed.row_bytes - 1];
    sum += m.lm_head.data[(size_t)m.lm_head.rows * m.lm_head.row_bytes - 1];
    model_free(&m);
    (void)sum;
    return 0;
}
