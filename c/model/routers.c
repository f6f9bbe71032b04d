/* The router table: every router kind of the MoE blocks by name. */
#include "model/blocks.h"

#include <string.h>

extern const RouterKind router_softmax_topk, router_sigmoid_group, router_topk_softmax, router_sqrtsoftplus;

static const RouterKind *const routers[] = {
    &router_softmax_topk, &router_sigmoid_group, &router_topk_softmax, &router_sqrtsoftplus, NULL,
};

const RouterKind *router_find(const char *name) {
    for (int i = 0; routers[i]; i++)
        if (!strcmp(routers[i]->name, name)) return routers[i];
    return NULL;
}
