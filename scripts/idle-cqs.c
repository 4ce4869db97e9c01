// A load for daemon benchmarks: a verbs program that holds N completion queues open on the
// first device for S seconds and does nothing with them, as a host with many idle clients
// has. Run through the drop-in libibverbs, beside softrdmad, each CQ gets its ring there.
// scripts/daemon-scale.sh starts it with IDLE_CQS=N.
//
//   gcc -O2 -o /tmp/idle-cqs scripts/idle-cqs.c -libverbs
//   LD_LIBRARY_PATH=target/release /tmp/idle-cqs [N] [S]   (defaults: 1000 CQs, 10 s)
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "first-device.h"

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int secs = argc > 2 ? atoi(argv[2]) : 10;
    if (n <= 0 || secs <= 0) {
        fprintf(stderr, "usage: %s [CQS > 0] [SECONDS > 0]\n", argv[0]);
        return 2;
    }
    struct ibv_context *ctx = open_first_device("idle-cqs");
    if (!ctx)
        return 1;
    struct ibv_cq **cqs = calloc((size_t)n, sizeof *cqs);
    if (!cqs) {
        perror("idle-cqs: calloc");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        cqs[i] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
        if (!cqs[i]) {
            fprintf(stderr, "idle-cqs: ibv_create_cq failed after %d CQs\n", i);
            return 1;
        }
    }
    fprintf(stderr, "idle-cqs: %d CQs open for %d s\n", n, secs);
    sleep((unsigned)secs);
    for (int i = 0; i < n; i++)
        ibv_destroy_cq(cqs[i]);
    free(cqs);
    ibv_close_device(ctx);
    return 0;
}
