/* scratch(): per-thread buffers that grow on demand and go with their thread. A thread that ends
 * frees them (the ASan build's leak check at exit fails otherwise: nothing points at them then). */
#include <pthread.h>
#include <string.h>

#include "check.h"
#include "kernels/vec.h"

static void *use_every_slot(void *arg) {
    size_t n = *(size_t *)arg;
    int ok = 1;
    for (int slot = 0; slot < 5; slot++) {
        float *a = scratch(slot, n);
        ok &= a != NULL;
        if (a) memset(a, 0, n * sizeof(float));
        float *b = scratch(slot, 2 * n); /* grows: the first buffer is freed, the second kept */
        ok &= b != NULL;
        if (b) b[2 * n - 1] = 1.0f;
        ok &= scratch(slot, n) == b; /* a smaller ask keeps the larger buffer */
    }
    return (void *)(size_t)ok;
}

void test_scratch(void) {
    for (int round = 0; round < 3; round++) {
        pthread_t t[4];
        size_t n[4];
        for (int i = 0; i < 4; i++) {
            n[i] = 1000u << i;
            CHECK(pthread_create(&t[i], NULL, use_every_slot, &n[i]) == 0, "thread %d starts", i);
        }
        for (int i = 0; i < 4; i++) {
            void *ok = NULL;
            pthread_join(t[i], &ok);
            CHECK(ok == (void *)1, "round %d thread %d: scratch grows and keeps its largest buffer", round, i);
        }
    }
}
