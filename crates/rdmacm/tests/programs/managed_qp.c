/* An rdma_cm connection whose QPs the program moves itself, as UCX and libfabric do: the
 * QPs come from ibv_create_qp (the ids have none), the connection parameters name them
 * (conn_param.qp_num), every transition takes its attributes from rdma_init_qp_attr, and
 * the active side answers RDMA_CM_EVENT_CONNECT_RESPONSE with rdma_establish. Then one
 * SEND each way, checked, and a disconnect whose DISCONNECTED and TIMEWAIT_EXIT both sides
 * see.
 *
 *   managed_qp -s -p PORT [-a BIND]     server
 *   managed_qp -c -a SERVER -p PORT     client
 *
 * Exit status 0 only if everything arrived as sent; every failure says what failed. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define CHECK(cond, what)                                                                  \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "managed_qp: %s failed (%m)\n", what);             \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static struct rdma_event_channel *channel;

struct res {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[256];
};

/* The next event, which must be `want`; exits otherwise ("rejected" is what the test
 * harness reads as a server that is not listening yet). */
static struct rdma_cm_event *expect(enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;

	CHECK(rdma_get_cm_event(channel, &e) == 0, "rdma_get_cm_event");
	if (e->event != want) {
		fprintf(stderr, "managed_qp: got %s (status %d), wanted %s%s\n",
			rdma_event_str(e->event), e->status, rdma_event_str(want),
			e->event == RDMA_CM_EVENT_REJECTED ? ": rejected" : "");
		exit(1);
	}
	return e;
}

static void setup(struct rdma_cm_id *id, struct res *r)
{
	struct ibv_qp_init_attr a = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	CHECK(id->qp == NULL, "an id without a QP");
	r->pd = ibv_alloc_pd(id->verbs);
	CHECK(r->pd, "ibv_alloc_pd");
	r->cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	CHECK(r->cq, "ibv_create_cq");
	a.send_cq = r->cq;
	a.recv_cq = r->cq;
	r->qp = ibv_create_qp(r->pd, &a);
	CHECK(r->qp, "ibv_create_qp");
	printf("local QP %u\n", r->qp->qp_num);
	r->mr = ibv_reg_mr(r->pd, r->buf, sizeof(r->buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(r->mr, "ibv_reg_mr");
}

/* Take the QP to `state` with the attributes the connection manager hands out. */
static void move(struct rdma_cm_id *id, struct res *r, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = { .qp_state = state };
	struct ibv_qp_attr got;
	struct ibv_qp_init_attr init;
	int mask = 0;

	CHECK(rdma_init_qp_attr(id, &attr, &mask) == 0, "rdma_init_qp_attr");
	CHECK(attr.qp_state == state && (mask & IBV_QP_STATE), "the attributes' state");
	CHECK(ibv_modify_qp(r->qp, &attr, mask) == 0, "ibv_modify_qp");
	CHECK(ibv_query_qp(r->qp, &got, IBV_QP_STATE, &init) == 0, "ibv_query_qp");
	CHECK(got.qp_state == state, "the QP's new state");
	if (state == IBV_QPS_RTR)
		printf("RTR: dest_qp_num %u rq_psn %u path_mtu %d\n", attr.dest_qp_num,
		       attr.rq_psn, attr.path_mtu);
	if (state == IBV_QPS_RTS)
		printf("RTS: sq_psn %u\n", attr.sq_psn);
}

static void post_recv(struct res *r)
{
	struct ibv_sge sge = { (uintptr_t)r->buf, 128, r->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	CHECK(ibv_post_recv(r->qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void send_text(struct res *r, const char *text)
{
	struct ibv_sge sge = { (uintptr_t)(r->buf + 128), (uint32_t)strlen(text) + 1, r->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	strcpy(r->buf + 128, text);
	CHECK(ibv_post_send(r->qp, &wr, &bad) == 0, "ibv_post_send");
}

/* Work requests completed so far (bit wr_id), whichever came first. */
static unsigned completed;

/* Wait (up to ~20 s) for the completion of work request `wr_id`. */
static void completion(struct res *r, uint64_t wr_id)
{
	struct ibv_wc wc;
	int i, n;

	for (i = 0; i < 200000 && !(completed & (1u << wr_id)); i++) {
		n = ibv_poll_cq(r->cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n == 0) {
			usleep(100);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "managed_qp: wr %lu: %s\n", (unsigned long)wc.wr_id,
				ibv_wc_status_str(wc.status));
			exit(1);
		}
		completed |= 1u << (wc.wr_id & 31);
	}
	if (!(completed & (1u << wr_id))) {
		fprintf(stderr, "managed_qp: no completion for wr %lu\n", (unsigned long)wr_id);
		exit(1);
	}
}

static void check_text(struct res *r, const char *want)
{
	if (strcmp(r->buf, want) != 0) {
		fprintf(stderr, "managed_qp: received \"%.64s\", wanted \"%s\"\n", r->buf, want);
		exit(1);
	}
	printf("received: %s\n", r->buf);
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
	struct rdma_conn_param param = { 0 };
	struct rdma_cm_id *listen_id, *id;
	struct rdma_cm_event *e;
	struct res r = { 0 };
	const char *welcome = "welcome";

	CHECK(rdma_create_id(channel, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&ss) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(listen_id, 1) == 0, "rdma_listen");

	e = expect(RDMA_CM_EVENT_CONNECT_REQUEST);
	id = e->id;
	CHECK(e->param.conn.private_data_len >= 14 &&
		      memcmp(e->param.conn.private_data, "hello managed", 14) == 0,
	      "the request's private data");
	printf("request from QP %u\n", e->param.conn.qp_num);
	rdma_ack_cm_event(e);

	/* As rdma-core's rdma_accept does for an id's own QP: RTR and RTS before the REP. */
	setup(id, &r);
	move(id, &r, IBV_QPS_INIT);
	move(id, &r, IBV_QPS_RTR);
	move(id, &r, IBV_QPS_RTS);
	post_recv(&r);
	param.qp_num = r.qp->qp_num;
	param.private_data = welcome;
	param.private_data_len = strlen(welcome) + 1;
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	CHECK(rdma_accept(id, &param) == 0, "rdma_accept");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ESTABLISHED));
	printf("established\n");

	completion(&r, 1);
	check_text(&r, "ping from the client");
	send_text(&r, "pong from the server");
	completion(&r, 2);

	rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED));
	/* The id lives on: the end of the connection's time-wait is reported too. */
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_TIMEWAIT_EXIT));
	printf("managed_qp server: done\n");
	ibv_destroy_qp(r.qp);
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	return 0;
}

static int client(const char *to, const char *port)
{
	struct sockaddr_storage ss = address(to, port);
	struct rdma_conn_param param = { 0 };
	struct rdma_cm_event *e;
	struct rdma_cm_id *id;
	struct res r = { 0 };
	const char *hello = "hello managed";

	CHECK(rdma_create_id(channel, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, 2000) == 0, "rdma_resolve_addr");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_ROUTE_RESOLVED));

	setup(id, &r);
	move(id, &r, IBV_QPS_INIT);
	post_recv(&r);
	/* No connection to establish yet. */
	CHECK(rdma_establish(id) != 0, "rdma_establish before the answer refused");

	param.qp_num = r.qp->qp_num;
	param.private_data = hello;
	param.private_data_len = strlen(hello) + 1;
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	CHECK(rdma_connect(id, &param) == 0, "rdma_connect");

	e = expect(RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(e->param.conn.private_data_len > 0 &&
		      strcmp(e->param.conn.private_data, "welcome") == 0,
	      "the answer's private data");
	printf("response from QP %u\n", e->param.conn.qp_num);
	rdma_ack_cm_event(e);

	move(id, &r, IBV_QPS_RTR);
	move(id, &r, IBV_QPS_RTS);
	CHECK(rdma_establish(id) == 0, "rdma_establish");
	printf("established\n");

	send_text(&r, "ping from the client");
	completion(&r, 2);
	completion(&r, 1);
	check_text(&r, "pong from the server");

	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(expect(RDMA_CM_EVENT_TIMEWAIT_EXIT));
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect of a closed connection");
	printf("managed_qp client: done\n");
	ibv_destroy_qp(r.qp);
	rdma_destroy_id(id);
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
		fprintf(stderr, "usage: managed_qp -s -p PORT [-a BIND] | -c -a SERVER -p PORT\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	channel = rdma_create_event_channel();
	CHECK(channel, "rdma_create_event_channel");
	return serve ? server(addr ? addr : "0.0.0.0", port) : client(addr, port);
}
