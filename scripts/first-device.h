// The first RDMA device, opened, for the stand-alone verbs programs in this folder
// (control-cost.c, idle-cqs.c); prints why and returns NULL when there is none.
#include <infiniband/verbs.h>
#include <stdio.h>

static struct ibv_context *open_first_device(const char *prog) {
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list || !list[0]) {
        fprintf(stderr, "%s: no RDMA device\n", prog);
        return NULL;
    }
    struct ibv_context *ctx = ibv_open_device(list[0]);
    if (!ctx)
        fprintf(stderr, "%s: ibv_open_device failed\n", prog);
    ibv_free_device_list(list);
    return ctx;
}
