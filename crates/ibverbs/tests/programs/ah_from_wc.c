/*
 * A UD reply addressed by ibv_create_ah_from_wc, in two roles (two processes, each on the
 * first device the library lists):
 *
 *   ah_from_wc responder <requester-ip> <ready-file>
 *     posts a receive, writes its QPN to <ready-file>, waits for one datagram, checks the
 *     GRH the device put in front of it, builds the attribute with ibv_init_ah_from_wc and
 *     the AH with ibv_create_ah_from_wc, sends "pong" back through it, then checks that bad
 *     input fails with rdma-core's errno. Prints "RESPONDER OK".
 *   ah_from_wc requester <responder-ip> <responder-qpn>
 *     sends "ping" through an AH of its own making (hop limit 33, traffic class 0x20, flow
 *     label 0x12345) and waits for the reply, which must come from the responder's QP and
 *     address. Prints "REQUESTER OK".
 *
 * Both CQs of each side share one completion channel; the requester waits for the reply
 * on the channel's descriptor (an event of its second CQ), then makes the descriptor
 * non-blocking and expects ibv_get_cq_event to fail with EAGAIN, as rdma-core's does.
 *
 * Each prints the hop limit, traffic class and flow label of the GRH it received
 * ("GRH hop_limit=33 traffic_class=32 flow_label=0x12345"): where the device delivers the
 * packet's own header, both show the requester's values (the reply's AH carried them back).
 *
 * Built against Debian's libibverbs headers and library, run on the drop-in.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define QKEY 0x11111111u
#define GRH 40
#define BUF 4096
#define SEND_AT 2048
#define HOP_LIMIT 33
#define TRAFFIC_CLASS 0x20
#define FLOW_LABEL 0x12345

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	union ibv_gid own;
	unsigned char *buf;
};

static void gid_of(const char *ip, union ibv_gid *g, int *v4)
{
	struct in_addr a4;
	memset(g, 0, sizeof(*g));
	if (inet_pton(AF_INET, ip, &a4) == 1) {
		g->raw[10] = g->raw[11] = 0xff;
		memcpy(&g->raw[12], &a4, 4);
		*v4 = 1;
	} else if (inet_pton(AF_INET6, ip, g->raw) == 1) {
		*v4 = 0;
	} else {
		die("not an IP address: %s", ip);
	}
}

static void setup(struct side *s)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no device");
	s->ctx = ibv_open_device(list[0]);
	CHECK(s->ctx, "ibv_open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	CHECK(ibv_query_gid(s->ctx, 1, 0, &s->own) == 0, "ibv_query_gid");
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd, "ibv_alloc_pd");
	s->buf = calloc(1, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE);
	CHECK(s->mr, "ibv_reg_mr");
	s->ch = ibv_create_comp_channel(s->ctx);
	CHECK(s->ch, "ibv_create_comp_channel: %s", strerror(errno));
	s->scq = ibv_create_cq(s->ctx, 4, NULL, s->ch, 0);
	s->rcq = ibv_create_cq(s->ctx, 4, NULL, s->ch, 0);
	CHECK(s->scq && s->rcq, "ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = s->scq,
		.recv_cq = s->rcq,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	s->qp = ibv_create_qp(s->pd, &init);
	CHECK(s->qp, "ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = QKEY };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_QKEY) == 0, "to INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE) == 0, "to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "to RTS");
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, SEND_AT, s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void send_to(struct side *s, struct ibv_ah *ah, uint32_t qpn, const char *msg)
{
	size_t len = strlen(msg) + 1;
	memcpy(s->buf + SEND_AT, msg, len);
	struct ibv_sge sge = { (uintptr_t)(s->buf + SEND_AT), (uint32_t)len, s->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.ud = { .ah = ah, .remote_qpn = qpn, .remote_qkey = QKEY },
	}, *bad;
	CHECK(ibv_post_send(s->qp, &wr, &bad) == 0, "ibv_post_send: %s", strerror(errno));
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_wc wait_wc(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double deadline = now() + 15;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq: %d", n);
		if (n == 1)
			break;
		CHECK(now() < deadline, "no %s completion in 15 s", what);
		sched_yield();
	}
	CHECK(wc.status == IBV_WC_SUCCESS, "%s completion: %s", what,
	      ibv_wc_status_str(wc.status));
	return wc;
}

/* The GRH the device wrote must name `from` as the source and `to` as the destination. */
static void check_grh(const unsigned char *g, const union ibv_gid *from,
		      const union ibv_gid *to, int v4)
{
	if (v4) {
		static const unsigned char zero[20];
		CHECK(memcmp(g, zero, 20) == 0, "IPv4 GRH: the first 20 bytes are not zero");
		CHECK(g[20] == 0x45, "IPv4 GRH: version/IHL byte %#x", g[20]);
		CHECK(g[29] == 17, "IPv4 GRH: protocol %u", g[29]);
		CHECK(memcmp(g + 32, &from->raw[12], 4) == 0, "IPv4 GRH: wrong source");
		CHECK(memcmp(g + 36, &to->raw[12], 4) == 0, "IPv4 GRH: wrong destination");
	} else {
		CHECK(g[0] >> 4 == 6, "IPv6 GRH: version %u", g[0] >> 4);
		CHECK(g[6] == 17, "IPv6 GRH: next header %u", g[6]);
		CHECK(memcmp(g + 8, from->raw, 16) == 0, "IPv6 GRH: wrong source");
		CHECK(memcmp(g + 24, to->raw, 16) == 0, "IPv6 GRH: wrong destination");
	}
}

/* Hop limit, traffic class and flow label of a received GRH (TTL and TOS for IPv4, which
 * has no flow label). */
static void print_grh(const unsigned char *g, int v4)
{
	const struct ibv_grh *grh = (const struct ibv_grh *)g;
	uint32_t word0 = ntohl(grh->version_tclass_flow);
	if (v4)
		printf("GRH hop_limit=%u traffic_class=%u flow_label=0x0\n", g[20 + 8], g[20 + 1]);
	else
		printf("GRH hop_limit=%u traffic_class=%u flow_label=%#x\n", grh->hop_limit,
		       (word0 >> 20) & 0xff, word0 & 0xfffff);
}

static void expect_ah_fails(struct ibv_pd *pd, struct ibv_wc *wc, void *grh, uint8_t port,
			    int err, const char *what)
{
	errno = 0;
	struct ibv_ah *ah = ibv_create_ah_from_wc(pd, wc, grh, port);
	CHECK(!ah, "ibv_create_ah_from_wc with %s made an AH", what);
	CHECK(errno == err, "ibv_create_ah_from_wc with %s: errno %d (%s), want %d", what,
	      errno, strerror(errno), err);
}

static void expect_init_fails(struct ibv_context *ctx, struct ibv_wc *wc, void *grh,
			      struct ibv_ah_attr *attr, int err, const char *what)
{
	errno = 0;
	int r = ibv_init_ah_from_wc(ctx, 1, wc, grh, attr);
	CHECK(r == -1 && errno == err, "ibv_init_ah_from_wc with %s: %d, errno %d (%s), want -1, %d",
	      what, r, errno, strerror(errno), err);
}

static void bad_input(struct side *s, struct ibv_wc *wc, int v4)
{
	struct ibv_grh *grh = (struct ibv_grh *)s->buf;
	struct ibv_ah_attr attr;
	unsigned char copy[GRH];

	expect_ah_fails(NULL, wc, grh, 1, EINVAL, "a NULL PD");
	expect_ah_fails(s->pd, NULL, grh, 1, EINVAL, "a NULL completion");
	expect_ah_fails(s->pd, wc, NULL, 1, EINVAL, "a NULL GRH");
	expect_ah_fails(s->pd, wc, grh, 2, EINVAL, "port 2");
	expect_init_fails(NULL, wc, grh, &attr, EINVAL, "a NULL context");
	expect_init_fails(s->ctx, wc, grh, NULL, EINVAL, "a NULL attribute");

	/* A destination that is not in the GID table. */
	memcpy(copy, s->buf, GRH);
	copy[GRH - 1] ^= 0x01;
	expect_init_fails(s->ctx, wc, copy, &attr, EINVAL, "a foreign destination");
	expect_ah_fails(s->pd, wc, copy, 1, EINVAL, "a foreign destination");

	/* Neither IPv4 nor IPv6. */
	memset(copy, 0, GRH);
	expect_init_fails(s->ctx, wc, copy, &attr, EPROTONOSUPPORT, "no IP header");

	if (!v4) {
		/* RoCE v1: an IB GRH asks for a RoCE v1 GID, and the port has none. */
		memcpy(copy, s->buf, GRH);
		copy[6] = 0x1b;
		expect_init_fails(s->ctx, wc, copy, &attr, EINVAL, "a RoCE v1 GRH");
	}

	/* Without IBV_WC_GRH: a non-global attribute (rdma-core succeeds), which a RoCE port
	 * cannot turn into an AH. */
	struct ibv_wc plain = *wc;
	plain.wc_flags &= ~IBV_WC_GRH;
	memset(&attr, 0xaa, sizeof(attr));
	CHECK(ibv_init_ah_from_wc(s->ctx, 1, &plain, NULL, &attr) == 0,
	      "ibv_init_ah_from_wc without a GRH: %s", strerror(errno));
	CHECK(attr.is_global == 0 && attr.dlid == plain.slid && attr.port_num == 1,
	      "ibv_init_ah_from_wc without a GRH: is_global %u dlid %u port %u",
	      attr.is_global, attr.dlid, attr.port_num);
	expect_ah_fails(s->pd, &plain, grh, 1, EINVAL, "no GRH on a RoCE port");
}

static int responder(const char *peer_ip, const char *ready)
{
	struct side s;
	union ibv_gid peer;
	int v4;

	gid_of(peer_ip, &peer, &v4);
	setup(&s);
	post_recv(&s);

	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s.tmp", ready);
	FILE *f = fopen(tmp, "w");
	CHECK(f, "open %s", tmp);
	fprintf(f, "%u\n", s.qp->qp_num);
	fclose(f);
	CHECK(rename(tmp, ready) == 0, "rename %s", tmp);

	struct ibv_wc wc = wait_wc(s.rcq, "receive");
	CHECK(wc.opcode == IBV_WC_RECV, "opcode %d", wc.opcode);
	CHECK(wc.wc_flags & IBV_WC_GRH, "no IBV_WC_GRH");
	CHECK(wc.byte_len == GRH + 5, "byte_len %u", wc.byte_len);
	/* RoCE has no SL: the packet type is there, as mlx5 reports it and UCX's ud_verbs reads
	 * it (bit 3: RoCEv2; bits 2:0: 2 IPv4, 1 IPv6). */
	CHECK(wc.sl == (v4 ? 0xa : 0x9), "sl %#x for an IPv%d datagram", wc.sl, v4 ? 4 : 6);
	CHECK(strcmp((char *)s.buf + GRH, "ping") == 0, "payload %.8s", s.buf + GRH);
	check_grh(s.buf, &peer, &s.own, v4);
	print_grh(s.buf, v4);

	struct ibv_grh *grh = (struct ibv_grh *)s.buf;
	struct ibv_ah_attr attr;
	memset(&attr, 0xaa, sizeof(attr));
	CHECK(ibv_init_ah_from_wc(s.ctx, 1, &wc, grh, &attr) == 0, "ibv_init_ah_from_wc: %s",
	      strerror(errno));
	uint32_t word0 = ntohl(grh->version_tclass_flow);
	uint8_t hop = v4 ? s.buf[20 + 8] : grh->hop_limit;
	uint8_t tclass = v4 ? s.buf[20 + 1] : (uint8_t)(word0 >> 20);
	CHECK(attr.is_global == 1, "is_global %u", attr.is_global);
	CHECK(memcmp(attr.grh.dgid.raw, peer.raw, 16) == 0, "dgid is not the requester's");
	CHECK(attr.grh.sgid_index == 0, "sgid_index %u", attr.grh.sgid_index);
	CHECK(attr.grh.hop_limit == hop, "hop_limit %u (packet %u)",
	      attr.grh.hop_limit, hop);
	CHECK(attr.grh.traffic_class == tclass, "traffic_class %u (packet %u)",
	      attr.grh.traffic_class, tclass);
	CHECK(attr.grh.flow_label == (word0 & 0xfffff), "flow_label %#x (GRH %#x)",
	      attr.grh.flow_label, word0 & 0xfffff);
	CHECK(attr.dlid == wc.slid && attr.sl == wc.sl &&
	      attr.src_path_bits == wc.dlid_path_bits && attr.port_num == 1,
	      "dlid %u sl %u src_path_bits %u port %u", attr.dlid, attr.sl,
	      attr.src_path_bits, attr.port_num);

	struct ibv_ah *ah = ibv_create_ah_from_wc(s.pd, &wc, grh, 1);
	CHECK(ah, "ibv_create_ah_from_wc: %s", strerror(errno));
	send_to(&s, ah, wc.src_qp, "pong");
	wait_wc(s.scq, "send");

	bad_input(&s, &wc, v4);
	CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
	printf("RESPONDER OK\n");
	return 0;
}

static int requester(const char *peer_ip, const char *qpn_s)
{
	struct side s;
	union ibv_gid peer;
	int v4;
	uint32_t qpn = (uint32_t)strtoul(qpn_s, NULL, 0);

	gid_of(peer_ip, &peer, &v4);
	setup(&s);
	post_recv(&s);
	struct ibv_ah_attr attr = {
		.grh = { .dgid = peer, .flow_label = FLOW_LABEL, .sgid_index = 0,
			 .hop_limit = HOP_LIMIT, .traffic_class = TRAFFIC_CLASS },
		.is_global = 1,
		.port_num = 1,
	};
	struct ibv_ah *ah = ibv_create_ah(s.pd, &attr);
	CHECK(ah, "ibv_create_ah: %s", strerror(errno));
	CHECK(ibv_req_notify_cq(s.rcq, 0) == 0, "ibv_req_notify_cq");
	send_to(&s, ah, qpn, "ping");
	wait_wc(s.scq, "send");

	/* The reply's event comes through the channel's descriptor, though the receive CQ is
	 * the second CQ of the channel. */
	struct pollfd p = { .fd = s.ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 15000) == 1, "the channel's fd never became readable");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(ibv_get_cq_event(s.ch, &ev_cq, &ev_ctx) == 0, "ibv_get_cq_event");
	CHECK(ev_cq == s.rcq, "the event names the send CQ, not the receive CQ");
	ibv_ack_cq_events(ev_cq, 1);
	struct ibv_wc wc = wait_wc(s.rcq, "reply");
	int fl = fcntl(s.ch->fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(s.ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "fcntl");
	errno = 0;
	CHECK(ibv_get_cq_event(s.ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "ibv_get_cq_event on a quiet non-blocking channel: errno %d (%s)", errno,
	      strerror(errno));
	CHECK(wc.src_qp == qpn, "reply from QP %u, not %u", wc.src_qp, qpn);
	CHECK(wc.wc_flags & IBV_WC_GRH, "reply without IBV_WC_GRH");
	CHECK(strcmp((char *)s.buf + GRH, "pong") == 0, "reply payload %.8s", s.buf + GRH);
	check_grh(s.buf, &peer, &s.own, v4);
	print_grh(s.buf, v4);
	printf("REQUESTER OK\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 4 && strcmp(argv[1], "responder") == 0)
		return responder(argv[2], argv[3]);
	if (argc == 4 && strcmp(argv[1], "requester") == 0)
		return requester(argv[2], argv[3]);
	fprintf(stderr, "usage: %s responder <requester-ip> <ready-file>\n"
			"       %s requester <responder-ip> <responder-qpn>\n",
		argv[0], argv[0]);
	return 2;
}
