# ibv_post_send on a full send queue fails with ENOMEM, through the drop-in: rdma-core's own
# test resources make an RC pair whose client QP holds DEPTH send WRs; the server posts no
# receive yet, so every SEND waits for one (RNR NAKs, retried forever: RNR_RETRY 7). DEPTH WRs
# (unsignaled ones and a signaled last) are taken, the next is refused with ENOMEM; once the
# signaled one's completion is polled, DEPTH fit again and no more.
import errno, os, sys
import pyverbs.enums as e
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR
from tests.base import RCResources
import tests.utils as u

DEPTH = 4


class Resources(RCResources):
    def create_qp_cap(self):
        return QPCap(max_send_wr=DEPTH, max_recv_wr=self.num_msgs)

    def create_qp_init_attr(self):
        # pyverbs signals every WR unless told otherwise.
        return QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                          cap=self.create_qp_cap(), sq_sig_all=0)


def send(signaled):
    sge = SGE(client.mr.buf, 8, client.mr.lkey)
    flags = e.IBV_SEND_SIGNALED if signaled else 0
    client.qp.post_send(SendWR(num_sge=1, sg=[sge], send_flags=flags))


def refused():
    try:
        send(True)
    except PyverbsRDMAError as ex:
        assert ex.error_code == errno.ENOMEM, ex
        return
    raise AssertionError("a send WR beyond max_send_wr was taken")


dev = sys.argv[1]
server = Resources(dev, 1, 0)
client = Resources(dev, 1, 0)
server.pre_run(client.psns, client.qps_num)
client.pre_run(server.psns, server.qps_num)
attr, _ = client.qp.query(e.IBV_QP_CAP)
assert attr.cap.max_send_wr == DEPTH, attr.cap.max_send_wr
for i in range(DEPTH):
    send(i == DEPTH - 1)
refused()
for _ in range(DEPTH):
    server.qp.post_recv(u.get_recv_wr(server))
u.poll_cq(server.cq, DEPTH)
u.poll_cq(client.cq, 1)
for _ in range(DEPTH):
    send(True)
refused()
for _ in range(DEPTH):
    server.qp.post_recv(u.get_recv_wr(server))
u.poll_cq(client.cq, DEPTH)
assert client.cq.poll()[0] == 0, "more completions than signaled WRs"
print("send queue full OK", flush=True)
# Leave without pyverbs' teardown: the process's exit releases every object (softrdmad
# reclaims what a connection held).
os._exit(0)
