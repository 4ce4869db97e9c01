/*
 * Open a context, make a PD, a CQ on a completion channel, an MR and a QP on it, and close
 * it without destroying any of them, many times over: the process's descriptors and address
 * space must stay flat (what the device held for the objects goes with the close; only
 * their C structs stay, as rdma-core leaves them). The completion channel is the program's:
 * it is destroyed after the close, which its CQ must have let go of.
 *
 *   close_leftovers [ROUNDS]
 *
 * Prints "LEFTOVERS OK" with the descriptors and the address space after the warm-up
 * rounds and at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define WARMUP 10

static int descriptors(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	CHECK(d, "open /proc/self/fd");
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* VmSize in KiB. */
static long address_space(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	CHECK(f, "open /proc/self/status");
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmSize: %ld", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 200;
	static char buf[65536];
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	int fds = 0;
	long vm = 0;
	for (int i = 0; i < rounds; i++) {
		struct ibv_context *c = ibv_open_device(list[0]);
		CHECK(c, "ibv_open_device (round %d): %s", i, strerror(errno));
		struct ibv_pd *pd = ibv_alloc_pd(c);
		struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
		CHECK(ch, "ibv_create_comp_channel (round %d)", i);
		struct ibv_cq *cq = ibv_create_cq(c, 16, NULL, ch, 0);
		CHECK(pd && cq, "PD or CQ (round %d)", i);
		struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_qp_init_attr init = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		struct ibv_qp *qp = ibv_create_qp(pd, &init);
		CHECK(mr && qp, "MR or QP (round %d): %s", i, strerror(errno));
		CHECK(ibv_close_device(c) == 0, "ibv_close_device (round %d)", i);
		int r = ibv_destroy_comp_channel(ch);
		CHECK(r == 0, "ibv_destroy_comp_channel after the close (round %d): %d", i, r);
		if (i == WARMUP - 1) {
			fds = descriptors();
			vm = address_space();
		}
	}
	ibv_free_device_list(list);
	int fds_end = descriptors();
	long vm_end = address_space();
	CHECK(fds_end <= fds, "descriptors grew from %d to %d over %d closes", fds, fds_end,
	      rounds - WARMUP);
	/* Allocator noise, not a mapping per round (half a megabyte each, before). */
	CHECK(vm_end - vm < 8192, "address space grew from %ld to %ld KiB over %d closes", vm,
	      vm_end, rounds - WARMUP);
	printf("LEFTOVERS OK: %d descriptors, %ld KiB after %d rounds; %d, %ld KiB after %d\n",
	       fds, vm, WARMUP, fds_end, vm_end, rounds);
	return 0;
}
