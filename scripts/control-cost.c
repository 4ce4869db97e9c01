// What a control call costs: a verbs program that allocates and frees a protection domain,
// then creates and destroys a completion queue, then registers and deregisters a buffer of
// 4 KiB and one of 1 MiB (page-aligned heap memory, written once), N times each on the first
// device, and prints the time per call (per pair, for the registrations). Through the
// drop-in libibverbs beside softrdmad every call is a round trip on the control socket (a
// CQ's create and destroy also map and unmap its ring; a registration of private memory
// adopts it into shared memory, unless SOFTRDMA_ADOPT_MEMORY=0).
//
//   gcc -O2 -o /tmp/control-cost scripts/control-cost.c -libverbs
//   LD_LIBRARY_PATH=target/release /tmp/control-cost [N]   (default: 5000)
//
// taskset -c 0 on both softrdmad and the program shows the cost without a wakeup on another
// CPU.
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "first-device.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 5000;
    if (n <= 0) {
        fprintf(stderr, "usage: %s [N > 0]\n", argv[0]);
        return 2;
    }
    struct ibv_context *ctx = open_first_device("control-cost");
    if (!ctx)
        return 1;
    double t = now();
    for (int i = 0; i < n; i++) {
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        if (!pd || ibv_dealloc_pd(pd)) {
            perror("protection domain");
            return 1;
        }
    }
    printf("ibv_alloc_pd + ibv_dealloc_pd: %.1f us per call\n", (now() - t) / n / 2 * 1e6);
    t = now();
    for (int i = 0; i < n; i++) {
        struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
        if (!cq || ibv_destroy_cq(cq)) {
            perror("completion queue");
            return 1;
        }
    }
    printf("ibv_create_cq + ibv_destroy_cq: %.1f us per call\n", (now() - t) / n / 2 * 1e6);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    if (!pd) {
        perror("protection domain");
        return 1;
    }
    for (size_t len = 4096; len <= (1 << 20); len *= 256) {
        char *buf = aligned_alloc(4096, len);
        if (!buf) {
            perror("aligned_alloc");
            return 1;
        }
        memset(buf, 1, len);
        t = now();
        for (int i = 0; i < n; i++) {
            int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);
            if (!mr || ibv_dereg_mr(mr)) {
                perror("memory region");
                return 1;
            }
        }
        printf("ibv_reg_mr + ibv_dereg_mr of %zu KiB: %.1f us per pair\n", len >> 10,
               (now() - t) / n * 1e6);
        free(buf);
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    return 0;
}
