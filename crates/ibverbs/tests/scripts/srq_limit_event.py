# An SRQ limit event through the drop-in: rdma-core's own test resources (tests/base.py) make
# an RC pair, the server's SRQ is armed with limit 2 and holds 2 receives, one SEND takes one:
# context->async_fd must become readable, ibv_get_async_event must name the SRQ's event, and
# after it the descriptor must be quiet again. Made non-blocking by the program (as UCX does),
# the descriptor turns an empty ibv_get_async_event into EAGAIN instead of a wait.
import ctypes, errno, fcntl, os, select, sys
import pyverbs.enums as e
from pyverbs.srq import SrqAttr
from tests.base import RCResources
import tests.utils as u


def mapped(addr):
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr and addr + 512 <= hi:
                return True
    return False


def ibv_context(ctx):
    """The struct ibv_context * inside a pyverbs Context (its `context` property crashes):
    the pointer-sized field of the Python object pointing at a struct whose abi_compat
    (offset 320) is (void *)UINTPTR_MAX."""
    base = id(ctx)
    for off in range(16, 128, 8):
        p = ctypes.c_size_t.from_address(base + off).value
        if p % 8 == 0 and p > 0x10000 and mapped(p):
            if ctypes.c_size_t.from_address(p + 320).value == 2**64 - 1:
                return p
    raise SystemExit("no ibv_context found in the pyverbs Context")


def readable(fd, timeout):
    r, _, _ = select.select([fd], [], [], timeout)
    return r == [fd]


dev = sys.argv[1]
server = RCResources(dev, 1, 0, with_srq=True)
client = RCResources(dev, 1, 0)
server.pre_run(client.psns, client.qps_num)
client.pre_run(server.psns, server.qps_num)
fd = ctypes.c_int.from_address(ibv_context(server.ctx) + 268).value
assert fd >= 0, fd
for _ in range(2):
    server.srq.post_recv(u.get_recv_wr(server))
server.srq.modify(SrqAttr(srq_limit=2), e.IBV_SRQ_LIMIT)
send_wr, _ = u.get_send_elements(client, False)
client.qp.post_send(send_wr)
u.poll_cq(client.cq)
u.poll_cq(server.cq)
assert readable(fd, 10), "async_fd never became readable"
ev = server.ctx.get_async_event()
assert ev.event_type == e.IBV_EVENT_SRQ_LIMIT_REACHED, ev.event_type
ev.ack()
assert not readable(fd, 0), "async_fd still readable with no event left"
fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
verbs = ctypes.CDLL("libibverbs.so.1", use_errno=True)
event = ctypes.create_string_buffer(16)  # struct ibv_async_event
rc = verbs.ibv_get_async_event(ctypes.c_void_p(ibv_context(server.ctx)), event)
assert rc == -1, "ibv_get_async_event gave an event that was not there"
assert ctypes.get_errno() == errno.EAGAIN, os.strerror(ctypes.get_errno())
print("SRQ limit event OK", flush=True)
# Leave without pyverbs' teardown: the process's exit releases every object (softrdmad
# reclaims what a connection held).
os._exit(0)
