#include "check.h"
#include "quant.h"

int checks_passed, checks_failed;

int main(void) {
    kernels_init(0);
    test_json();
    test_quant();
    test_safetensors();
    test_protocol();
    test_sampler();
    test_sampler_top_p();
    test_tokenizer();
    test_blocks();
    test_kv_persist();
    test_logprob();
    test_router();
    printf("c unit tests (%s kernels): %d passed, %d failed\n", kern.name, checks_passed, checks_failed);
    return checks_failed != 0;
}
