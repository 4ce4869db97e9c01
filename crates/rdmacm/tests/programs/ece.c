/* ECE (Enhanced Connection Establishment) through rdma_cm, on ids without a QP (the only
 * ids rdma-core lets set or read ECE): each side sets its ECE with rdma_set_local_ece and
 * reads the other's with rdma_get_remote_ece, then a second request is refused with
 * rdma_reject_ece, which its connector sees as REJECTED with status 35.
 *
 *   ece -s -p PORT [-a BIND]     server
 *   ece -c -a SERVER -p PORT     client
 *
 * Exit status 0 only if every value arrived as rdma-core defines it; every failure says
 * what failed. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* Both sides speak for one vendor (an OUI; any 24 bits will do). */
#define VENDOR 0x00c0de
/* What the client asks for on its first connection, what the server grants, and what the
 * client asks for on its second, which the server refuses. */
#define ASKED 0x5eed0001u
#define GRANTED 0x0000acceu
#define REFUSED 0x0badu

#define CHECK(cond, what)                                                                  \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "ece: %s failed (%m)\n", what);                    \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static struct rdma_event_channel *channel;

struct res {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

/* The next event, which must be `want` ("rejected" tells the test harness that the
 * server was not listening yet). */
static struct rdma_cm_event *expect(enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;

	CHECK(rdma_get_cm_event(channel, &e) == 0, "rdma_get_cm_event");
	if (e->event != want) {
		fprintf(stderr, "ece: got %s (status %d), wanted %s%s\n", rdma_event_str(e->event),
			e->status, rdma_event_str(want),
			e->event == RDMA_CM_EVENT_REJECTED ? ": rejected" : "");
		exit(1);
	}
	return e;
}

/* A QP the program owns (the id gets none: ECE is for ids without one). */
static void setup(struct rdma_cm_id *id, struct res *r)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	r->pd = ibv_alloc_pd(id->verbs);
	CHECK(r->pd, "ibv_alloc_pd");
	r->cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
	CHECK(r->cq, "ibv_create_cq");
	a.send_cq = r->cq;
	a.recv_cq = r->cq;
	r->qp = ibv_create_qp(r->pd, &a);
	CHECK(r->qp, "ibv_create_qp");
}

static void teardown(struct res *r)
{
	ibv_destroy_qp(r->qp);
	ibv_destroy_cq(r->cq);
	ibv_dealloc_pd(r->pd);
}

static void move(struct rdma_cm_id *id, struct res *r, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = { .qp_state = state };
	int mask = 0;

	CHECK(rdma_init_qp_attr(id, &attr, &mask) == 0, "rdma_init_qp_attr");
	CHECK(ibv_modify_qp(r->qp, &attr, mask) == 0, "ibv_modify_qp");
}

static void set_ece(struct rdma_cm_id *id, uint32_t options)
{
	struct ibv_ece ece = { .vendor_id = VENDOR, .options = options };

	CHECK(rdma_set_local_ece(id, &ece) == 0, "rdma_set_local_ece");
}

/* The peer's ECE, which must be (`vendor`, `options`); printed as `what`. */
static void remote_ece(struct rdma_cm_id *id, const char *what, uint32_t vendor,
		       uint32_t options)
{
	struct ibv_ece ece = { .comp_mask = 0xff };

	CHECK(rdma_get_remote_ece(id, &ece) == 0, "rdma_get_remote_ece");
	printf("%s: vendor 0x%06x options 0x%x comp_mask %u\n", what, ece.vendor_id,
	       ece.options, ece.comp_mask);
	if (ece.vendor_id != vendor || ece.options != options || ece.comp_mask != 0) {
		fprintf(stderr, "ece: %s is not vendor 0x%06x options 0x%x\n", what, vendor,
			options);
		exit(1);
	}
}

static void conn_param(struct rdma_conn_param *p, struct res *r)
{
	memset(p, 0, sizeof(*p));
	p->qp_num = r->qp->qp_num;
	p->responder_resources = 1;
	p->initiator_depth = 1;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
}

static struct sockaddr_storage address(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST | AI_PASSIVE }, *ai;
	struct sockaddr_storage ss;

	CHECK(getaddrinfo(host, port, &hints, &ai) == 0, "getaddrinfo");
	memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return ss;
}

static int server(const char *bind_to, const char *port)
{
	struct sockaddr_storage ss = address(bind_to, port);
	struct rdma_conn_param param;
	struct rdma_cm_id *listen_id, *id, *refused;
	struct rdma_cm_event *e;
	struct ibv_ece bad;
	struct res r = { 0 };

	CHECK(rdma_create_id(channel, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&ss) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(listen_id, 2) == 0, "rdma_listen");

	e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	id = e->id;
	rdma_ack_cm_event(e);
	remote_ece(id, "request ece", VENDOR, ASKED);
	/* rdma-core refuses an ECE with no vendor or with a completion mask. */
	bad = (struct ibv_ece){ .vendor_id = 0, .options = 1 };
	CHECK(rdma_set_local_ece(id, &bad) == -1 && errno == EINVAL, "a vendor ID of 0 refused");
	bad = (struct ibv_ece){ .vendor_id = VENDOR, .comp_mask = 1 };
	CHECK(rdma_set_local_ece(id, &bad) == -1 && errno == EINVAL, "a comp_mask refused");
	set_ece(id, GRANTED);

	setup(id, &r);
	move(id, &r, IBV_QPS_INIT);
	move(id, &r, IBV_QPS_RTR);
	move(id, &r, IBV_QPS_RTS);
	conn_param(&param, &r);
	CHECK(rdma_accept(id, &param) == 0, "rdma_accept");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED));
	printf("established\n");

	/* The second request asks for options this side will not grant. */
	e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	refused = e->id;
	rdma_ack_cm_event(e);
	remote_ece(refused, "second request ece", VENDOR, REFUSED);
	CHECK(rdma_reject_ece(refused, NULL, 0) == 0, "rdma_reject_ece");
	rdma_destroy_id(refused);

	rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED));
	printf("ece server: done\n");
	rdma_destroy_id(id);
	teardown(&r);
	rdma_destroy_id(listen_id);
	return 0;
}

/* A new id with its route to the server. */
static struct rdma_cm_id *resolved(struct sockaddr_storage *ss)
{
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)ss, 2000) == 0, "rdma_resolve_addr");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED));
	return id;
}

static int client(const char *to, const char *port)
{
	struct sockaddr_storage ss = address(to, port);
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param param;
	struct rdma_cm_event *e;
	struct rdma_cm_id *id, *second, *with_qp;
	struct ibv_ece ece = { .vendor_id = VENDOR };
	struct res r = { 0 }, r2 = { 0 };

	/* An id with a QP of its own has its ECE from the QP: rdma-core refuses both calls. */
	with_qp = resolved(&ss);
	CHECK(rdma_create_qp(with_qp, NULL, &qa) == 0, "rdma_create_qp");
	CHECK(rdma_set_local_ece(with_qp, &ece) == -1 && errno == EINVAL,
	      "rdma_set_local_ece refused on an id with a QP");
	CHECK(rdma_get_remote_ece(with_qp, &ece) == -1 && errno == EINVAL,
	      "rdma_get_remote_ece refused on an id with a QP");
	rdma_destroy_qp(with_qp);
	rdma_destroy_id(with_qp);

	id = resolved(&ss);
	/* Nothing from the peer yet: rdma-core reports all zero, and success. */
	remote_ece(id, "ece before the answer", 0, 0);
	set_ece(id, ASKED);
	setup(id, &r);
	move(id, &r, IBV_QPS_INIT);
	conn_param(&param, &r);
	CHECK(rdma_connect(id, &param) == 0, "rdma_connect");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_CONNECT_RESPONSE));
	/* The REP: the REQ's vendor ID with the server's options. */
	remote_ece(id, "reply ece", VENDOR, GRANTED);
	move(id, &r, IBV_QPS_RTR);
	move(id, &r, IBV_QPS_RTS);
	CHECK(rdma_establish(id) == 0, "rdma_establish");
	printf("established\n");

	second = resolved(&ss);
	set_ece(second, REFUSED);
	setup(second, &r2);
	conn_param(&param, &r2);
	CHECK(rdma_connect(second, &param) == 0, "rdma_connect (second)");
	CHECK(rdma_get_cm_event(channel, &e) == 0, "rdma_get_cm_event");
	if (e->event != RDMA_CM_EVENT_REJECTED || e->status != 35) {
		fprintf(stderr, "ece: second connection got %s status %d, wanted status 35\n",
			rdma_event_str(e->event), e->status);
		exit(1);
	}
	printf("second connection refused: status %d\n", e->status);
	rdma_ack_cm_event(e);
	rdma_destroy_id(second);
	teardown(&r2);

	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED));
	printf("ece client: done\n");
	rdma_destroy_id(id);
	teardown(&r);
	return 0;
}

int main(int argc, char **argv)
{
	const char *addr = NULL, *port = NULL;
	int op, serve = -1;

	while ((op = getopt(argc, argv, "sca:p:")) != -1) {
		switch (op) {
		case 's': serve = 1; break;
		case 'c': serve = 0; break;
		case 'a': addr = optarg; break;
		case 'p': port = optarg; break;
		default: serve = -1; break;
		}
	}
	if (serve < 0 || !port || (!serve && !addr)) {
		fprintf(stderr, "usage: ece -s -p PORT [-a BIND] | -c -a SERVER -p PORT\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	channel = rdma_create_event_channel();
	CHECK(channel, "rdma_create_event_channel");
	return serve ? server(addr ? addr : "0.0.0.0", port) : client(addr, port);
}
