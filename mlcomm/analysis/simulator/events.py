"""The queue of ready messages: a binary heap on (ready time, ring distance, message id)."""

from .jit import njit


@njit(cache=True)
def _before(key, tie, val, i, j, or_equal):
    """Heap order: entry i comes before entry j by (key, tie, val)."""
    if key[i] != key[j]:
        return key[i] < key[j]
    if tie[i] != tie[j]:
        return tie[i] < tie[j]
    return val[i] <= val[j] if or_equal else val[i] < val[j]


@njit(cache=True)
def _swap(key, tie, val, i, j):
    key[i], key[j] = key[j], key[i]
    tie[i], tie[j] = tie[j], tie[i]
    val[i], val[j] = val[j], val[i]


@njit(cache=True)
def _heap_push(key, tie, val, n, k, t, v):
    i = n
    key[i] = k; tie[i] = t; val[i] = v
    while i > 0:
        j = (i - 1) >> 1
        if _before(key, tie, val, j, i, True):
            break
        _swap(key, tie, val, i, j)
        i = j
    return n + 1


@njit(cache=True)
def _heap_pop(key, tie, val, n):
    k, v = key[0], val[0]
    n -= 1
    key[0] = key[n]; tie[0] = tie[n]; val[0] = val[n]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= n:
            break
        b = a + 1
        c = a
        if b < n and _before(key, tie, val, b, a, False):
            c = b
        if _before(key, tie, val, i, c, True):
            break
        _swap(key, tie, val, i, c)
        i = c
    return k, v, n
