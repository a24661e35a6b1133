"""Contention for ports and NICs: when a ready message starts and ends.

A message takes the earliest-free send port of its source and receive port of its
destination (``ports`` of each; 0 = unlimited), and between nodes also a port of each
node's NIC (``nic_ports``; 0 = unlimited); it takes ``alpha + bytes * beta`` within a node,
``inter_alpha + bytes * inter_beta`` between nodes.
"""

import numpy as np

from .jit import njit


@njit(cache=True)
def free_ports(p, ports, rpn, nic_ports):
    """``(send_free, recv_free, nic_out, nic_in)``: when each port of each rank and NIC is
    next free (all at 0)."""
    kp = max(ports, 1)
    nodes = (p + rpn - 1) // rpn
    kn = max(nic_ports, 1)
    return np.zeros((p, kp)), np.zeros((p, kp)), np.zeros((nodes, kn)), np.zeros((nodes, kn))


@njit(cache=True)
def _take_port(ports, row, ready):
    """Return (start, column) of the earliest-free port of ``row`` for a message ready at ``ready``."""
    best = 0
    for c in range(1, ports.shape[1]):
        if ports[row, c] < ports[row, best]:
            best = c
    return max(ready, ports[row, best]), best


@njit(cache=True)
def transmit(mi, t0, src, dst, nbytes, send_free, recv_free, nic_out, nic_in, net):
    """``(start, end)`` of message ``mi``, ready at ``t0``, on the earliest-free ports (taken
    until ``end``); ``net`` is ``(alpha, beta, ports, rpn, inter_alpha, inter_beta,
    nic_ports)``."""
    alpha, beta, ports, rpn, inter_alpha, inter_beta, nic_ports = net
    s, d = src[mi], dst[mi]
    inter = rpn > 1 and s // rpn != d // rpn
    start = t0
    cs = 0
    cr = 0
    if ports > 0:
        start, cs = _take_port(send_free, s, start)
        start, cr = _take_port(recv_free, d, start)
        start = max(start, send_free[s, cs])
    cno = 0
    cni = 0
    if inter and nic_ports > 0:
        start, cno = _take_port(nic_out, s // rpn, start)
        start, cni = _take_port(nic_in, d // rpn, start)
        start = max(start, nic_out[s // rpn, cno])
        if ports > 0:
            start = max(start, send_free[s, cs], recv_free[d, cr])
    if inter:
        end = start + inter_alpha + nbytes[mi] * inter_beta
    else:
        end = start + alpha + nbytes[mi] * beta
    if ports > 0:
        send_free[s, cs] = end
        recv_free[d, cr] = end
    if inter and nic_ports > 0:
        nic_out[s // rpn, cno] = end
        nic_in[d // rpn, cni] = end
    return start, end
