#include <string.h>

#include "check.h"
#include "kernels/kernels.h"

int checks_passed, checks_failed;

/* `c_tests kernels` runs only the kernel tests (each set this CPU runs against the portable
 * reference): quick enough for an emulator (make ctest-aarch64). */
int main(int argc, char **argv) {
    kernels_init(0);
    if (argc > 1 && !strcmp(argv[1], "kernels")) {
        test_quant();
        test_matmul_fused();
        test_kv_kernel_sets();
        test_kernel_table();
        printf("c kernel tests (%s kernels): %d passed, %d failed\n", kern.name, checks_passed, checks_failed);
        return checks_failed != 0;
    }
    test_grow();
    test_huge_alloc();
    test_json();
    test_quant();
    test_matmul_fused();
    test_scratch();
    test_kernel_table();
    test_safetensors();
    test_protocol();
    test_grammar();
    test_sampler();
    test_sampler_top_p();
    test_sampler_sort();
    test_tokenizer();
    test_blocks();
    test_kv_persist();
    test_kv_log();
    test_logprob();
    test_expert_streaming();
    test_moe_exec();
    test_router();
    test_attend_split();
    test_delta_rule();
    printf("c unit tests (%s kernels): %d passed, %d failed\n", kern.name, checks_passed, checks_failed);
    return checks_failed != 0;
}
