# An inline SEND built with the extended QP API (wr_start, wr_send, wr_set_sge with
# IBV_SEND_INLINE in wr_flags, wr_complete): the bytes are copied when the work request is
# built, so the SGE's key is never used (here it is a wrong one) and the receiver gets them.
import os, random, sys
import pyverbs.enums as e
from pyverbs.qp import QPCap, QPInitAttrEx, QPAttr, QPEx
from pyverbs.wr import SGE
from tests.base import RCResources
import tests.utils as u


class InlineRes(RCResources):
    def create_qps(self):
        cap = QPCap(max_send_wr=10, max_recv_wr=10, max_recv_sge=1, max_send_sge=1,
                    max_inline_data=64)
        qia = QPInitAttrEx(cap=cap, qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                           pd=self.pd, send_ops_flags=e.IBV_QP_EX_WITH_SEND,
                           comp_mask=e.IBV_QP_INIT_ATTR_PD |
                           e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
        qp = QPEx(self.ctx, qia, QPAttr(port_num=self.ib_port))
        self.qps.append(qp)
        self.qps_num.append(qp.qp_num)
        self.psns.append(random.getrandbits(24))


dev = sys.argv[1]
client = InlineRes(dev, 1, 0)
server = InlineRes(dev, 1, 0)
client.pre_run(server.psns, server.qps_num)
server.pre_run(client.psns, client.qps_num)
server.qp.post_recv(u.get_recv_wr(server))
msg = b"inline via wr_set_sge"
client.mr.write(msg, len(msg))
qp = client.qp
qp.wr_start()
qp.wr_id = 7
qp.wr_flags = e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
qp.wr_send()
qp.wr_set_sge(SGE(client.mr.buf, len(msg), client.mr.lkey ^ 0x5a5a5a5a))
qp.wr_complete()
u.poll_cq(client.cq)
u.poll_cq(server.cq)
got = server.mr.read(len(msg), 0)
assert got == msg, got
print("inline ex send OK", flush=True)
os._exit(0)
