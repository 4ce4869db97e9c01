/*
 * ibv_close_device on a device whose memory region is still registered and still the
 * target of a peer's RDMA WRITEs: once the close returns, the device reaches the region's
 * memory no more, as a NIC's close ends its DMA into it.
 *
 *   close_with_regions
 *
 * One process, two contexts of the first device. Context A registers two whole pages of
 * heap memory and connects an RC QP to context B's. A thread of B writes an ever-growing
 * counter into A's region with RDMA WRITEs, keeping its send queue full. The main thread
 * closes A without deregistering or destroying anything, then reads the counter and checks,
 * while the writer keeps posting for 200 ms more, that it never moves again (the writer's
 * WRITEs fail once A is gone). The pages must hold every byte they held, and be the
 * program's private memory again (/proc/self/maps shows no shared file there). A second
 * context then registers the same pages: a device that was closed must not keep them.
 * Prints "CLOSE OK" with what it saw ("adopted" when the registration moved the pages into
 * shared memory, as on softrdmad). Last, a child made by fork closes the contexts it
 * inherited, the last one too, and the parent's copy must go on working.
 *
 * Built against Debian's libibverbs headers and library, run on the drop-in.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define PAGE 4096
#define LEN (2 * PAGE)
#define DEPTH 64

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The name /proc/self/maps shows for the mapping that holds addr ("" for anonymous). */
static void mapping_name(const void *addr, char *name, size_t len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[4096];
	CHECK(f, "open /proc/self/maps");
	name[0] = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned long start, end;
		int path = 0;
		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &start, &end, &path) < 2)
			continue;
		if (start <= (unsigned long)addr && (unsigned long)addr < end) {
			line[strcspn(line, "\n")] = 0;
			snprintf(name, len, "%s", path ? line + path : "");
			break;
		}
	}
	fclose(f);
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

static struct ibv_context *open_first(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	return ctx;
}

static void make_side(struct side *s)
{
	s->ctx = open_first();
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 2 * DEPTH, NULL, NULL, 0);
	CHECK(s->pd && s->cq, "PD or CQ");
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
	};
	s->qp = ibv_create_qp(s->pd, &init);
	CHECK(s->qp, "ibv_create_qp: %s", strerror(errno));
	CHECK(ibv_query_gid(s->ctx, 1, 0, &s->gid) == 0, "ibv_query_gid");
}

static void connect_to(struct side *s, const struct side *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER) == 0, "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 8;
	a.retry_cnt = 1;
	a.rnr_retry = 1;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");
}

static struct side b;
static uint64_t target_addr;
static uint32_t target_rkey;
static atomic_int stop;
static atomic_ullong written; /* WRITEs completed successfully */
static atomic_int failed;     /* the status of the first error completion seen */

/* B's writer: keeps DEPTH WRITEs of the next counter value in flight until told to stop. */
static void *writer(void *arg)
{
	(void)arg;
	uint64_t next = 1;
	int outstanding = 0;
	while (!stop) {
		while (outstanding < DEPTH && !failed) {
			uint64_t v = next++;
			struct ibv_sge sge = { .addr = (uintptr_t)&v, .length = sizeof v };
			struct ibv_send_wr wr = {
				.wr_id = v, .sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_INLINE,
				.wr.rdma = { .remote_addr = target_addr, .rkey = target_rkey },
			}, *bad;
			if (ibv_post_send(b.qp, &wr, &bad))
				break;
			outstanding++;
		}
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(b.cq, 16, wc);
		CHECK(n >= 0, "ibv_poll_cq");
		for (int i = 0; i < n; i++) {
			outstanding--;
			if (wc[i].status == IBV_WC_SUCCESS)
				written++;
			else if (!failed)
				failed = (int)wc[i].status;
		}
	}
	return NULL;
}

int main(void)
{
	struct side a;
	char name[4096];
	make_side(&a);
	make_side(&b);
	uint8_t *buf = aligned_alloc(PAGE, LEN);
	CHECK(buf, "aligned_alloc");
	for (int i = 0; i < LEN; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	struct ibv_mr *mr = ibv_reg_mr(a.pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "ibv_reg_mr: %s", strerror(errno));
	mapping_name(buf, name, sizeof name);
	int adopted = strstr(name, "softrdma-registered") != NULL;
	connect_to(&a, &b);
	connect_to(&b, &a);
	target_addr = (uintptr_t)buf;
	target_rkey = mr->rkey;

	pthread_t t;
	CHECK(pthread_create(&t, NULL, writer, NULL) == 0, "pthread_create");
	double until = now() + 10;
	while (written < 1000 && !failed && now() < until)
		;
	CHECK(written >= 1000, "the writer wrote %llu times (status %d)", written,
	      (int)failed);

	/* Close A with its region registered and its QP connected. */
	CHECK(ibv_close_device(a.ctx) == 0, "ibv_close_device");
	uint64_t seen;
	memcpy(&seen, buf, sizeof seen);
	unsigned long long at_close = written;
	until = now() + 0.2;
	while (now() < until) {
		uint64_t v;
		memcpy(&v, buf, sizeof v);
		CHECK(v == seen, "a WRITE landed after ibv_close_device returned: %llu, then %llu",
		      (unsigned long long)seen, (unsigned long long)v);
	}
	stop = 1;
	pthread_join(t, NULL);
	CHECK(seen > 0, "no WRITE landed before the close");
	for (int i = sizeof seen; i < LEN; i++)
		CHECK(buf[i] == (uint8_t)(i * 7 + 1), "byte %d changed", i);
	mapping_name(buf, name, sizeof name);
	CHECK(strstr(name, "softrdma-registered") == NULL,
	      "the closed device's region still maps a shared file: %s", name);

	/* A device opened now may take the same pages as if the first had never had them. */
	struct ibv_context *c = open_first();
	struct ibv_pd *pd = ibv_alloc_pd(c);
	CHECK(pd, "ibv_alloc_pd");
	mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr again: %s", strerror(errno));
	mapping_name(buf, name, sizeof name);
	int again = strstr(name, "softrdma-registered") != NULL;
	CHECK(again == adopted, "adopted the first time: %d, the second: %d", adopted, again);
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	/* A child made by fork that closes the contexts it inherited, the last one too (as a
	 * garbage-collected language's child may), succeeds and leaves the parent's device
	 * working: the device's threads are the parent's. */
	pid_t child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0)
		_exit(ibv_close_device(c) == 0 && ibv_close_device(b.ctx) == 0 ? 0 : 1);
	int status;
	CHECK(waitpid(child, &status, 0) == child, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child's ibv_close_device: %s %d", WIFEXITED(status) ? "exit" : "signal",
	      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr after a child closed its copy of the context: %s",
	      strerror(errno));
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(c) == 0,
	      "clean up");
	printf("CLOSE OK: %s, %llu WRITEs completed when the close returned, %llu in all, "
	       "the writer's first error status %d\n", adopted ? "adopted" : "not adopted", at_close,
	       (unsigned long long)written, (int)failed);
	return 0;
}
