/*
 * A program blocked on softrdmad's device when the daemon dies: ibv_get_cq_event must end
 * with -1 and errno ECONNRESET rather than wait for ever, and ibv_poll_cq must fail. The
 * context's async_fd must be readable, ibv_get_async_event must then give one
 * IBV_EVENT_DEVICE_FATAL (as a NIC that failed does), and after it async_fd must be quiet
 * again (a program that polls it, as UCX does, must not spin).
 *
 *   daemon_gone MARKER
 *
 * Creates MARKER just before it blocks in ibv_get_cq_event (the test then kills the
 * daemon). Prints "DAEMON GONE OK" with what each call returned.
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

int main(int argc, char **argv)
{
	CHECK(argc == 2, "usage: daemon_gone MARKER");
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device: %s", strerror(errno));
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch, "ibv_create_comp_channel");
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	CHECK(cq, "ibv_create_cq");
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	FILE *m = fopen(argv[1], "w");
	CHECK(m, "create %s", argv[1]);
	fclose(m);
	struct ibv_cq *got;
	void *cq_ctx;
	int r = ibv_get_cq_event(ch, &got, &cq_ctx);
	int err = errno;
	CHECK(r == -1 && err == ECONNRESET, "ibv_get_cq_event returned %d (errno %d: %s)", r,
	      err, strerror(err));
	struct ibv_wc wc;
	int polled = ibv_poll_cq(cq, 1, &wc);
	CHECK(polled < 0, "ibv_poll_cq returned %d after the daemon died", polled);
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	CHECK(poll(&p, 1, 5000) == 1, "async_fd did not become readable");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event: %s", strerror(errno));
	CHECK(ev.event_type == IBV_EVENT_DEVICE_FATAL, "async event %d, not DEVICE_FATAL",
	      (int)ev.event_type);
	ibv_ack_async_event(&ev);
	p.revents = 0;
	CHECK(poll(&p, 1, 200) == 0, "async_fd still readable after DEVICE_FATAL was taken");
	int flags = fcntl(ctx->async_fd, F_GETFL);
	CHECK(fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
	      "a second event after DEVICE_FATAL (errno %d)", errno);
	printf("DAEMON GONE OK: ibv_get_cq_event %d (%s), ibv_poll_cq %d, IBV_EVENT_DEVICE_FATAL "
	       "once\n", r, strerror(err), polled);
	return 0;
}
