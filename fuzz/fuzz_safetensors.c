/* st_open on an arbitrary file: a refusal with a message or a table whose every tensor lies
 * inside the mapping. */
#include "harness.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write(fuzz_tmpdir(), "x.safetensors", data, size);
    StFile f;
    char err[512] = "";
    if (st_open(&f, path, err, sizeof err)) {
        if (!err[0]) abort();
        return 0;
    }
    volatile unsigned sum = 0;
    for (size_t i = 0; i < f.n; i++) {
        const StTensor *t = &f.tensors[i];
        if (t->offset + t->nbytes > f.size || t->data != f.map + t->offset) abort();
        if (t->nbytes) sum += t->data[0] + t->data[t->nbytes - 1];
        sum += (unsigned)strlen(t->name);
    }
    st_close(&f);
    (void)sum;
    return 0;
}
