"""Arrivals at a switch with a shared buffer (switch.pool) and which of them it admits:
one rule, the data planes' tests check each plane against it.

The rule (incast.p4's pool_check and admit, the RTL switch's, the linux data plane's
plug in kernels/patches-um/0006): a frame of n bytes for a class queue holding q bytes,
the pool holding `used` of its `size`, is admitted if and only if

    used + n <= size  and  q + n <= alpha x (size - used)  and  q + n <= the queue's cap

(a pool of size 0 admits every frame to the cap). Its bytes are taken from the pool and
given back when it leaves. The cases hold every queue while the frames arrive, so what
is admitted depends on the arrivals alone, not on how fast a plane forwards."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PoolCase:
    name: str
    size: int                   # switch.pool.size, bytes
    alpha16: int                # switch.pool.alpha in sixteenths
    buffer: int                 # switch.buffer: each queue's cap is its class's share of it
    queues: int                 # switch.qos.queues
    arrivals: tuple[tuple[int, int, int], ...]   # (port, class, frame bytes), in order

    @property
    def overrides(self) -> dict:
        return {"buffer": self.buffer, "qos_queues": self.queues,
                "switch.pool": {"size": self.size, "alpha": self.alpha16 / 16}}


def admitted(case: PoolCase, caps: list[int]) -> tuple[list[bool], int]:
    """Per arrival whether the rule admits it (every queue held), and the most the pool
    held. caps: each class's cap in bytes (Scenario.switch.class_limits)."""
    used, most, occ, out = 0, 0, {}, []
    for port, cls, n in case.arrivals:
        q = occ.get((port, cls), 0)
        free = case.size - used if used < case.size else 0
        fits = case.size == 0 or (used + n <= case.size and q + n <= (free * case.alpha16) >> 4)
        ok = fits and q + n <= caps[cls]
        if ok:
            occ[(port, cls)] = q + n
            used += n
            most = max(most, used)
        out.append(ok)
    return out, most


def _lengths(k: int, seed: int) -> list[int]:
    """k frame lengths from 64 to 1514 bytes, the same on every machine (an LCG)."""
    out, x = [], seed
    for _ in range(k):
        x = (1103515245 * x + 12345) % 2**31
        out.append(64 + x % (1514 - 64 + 1))
    return out


CASES = (
    # A lone busy queue stops at alpha/(1+alpha) of the pool, below its own cap:
    # with 1042-byte frames the 10th is admitted (9378 + 1042 <= 20000 - 9378), the 11th not.
    PoolCase("lone queue, alpha 1", 20000, 16, 50000, 1, tuple((1, 0, 1042) for _ in range(30))),
    # Two busy queues under alpha 2 each stop near 2P/5.
    PoolCase("two queues, alpha 2", 30000, 32, 50000, 1,
             tuple((p, 0, 1042) for _ in range(30) for p in (1, 2))),
    # The queue's cap binds before the pool does.
    PoolCase("cap first", 100000, 128, 5000, 1, tuple((1, 0, 1042) for _ in range(10))),
    # Three ports under alpha 8: the pool's size binds.
    PoolCase("pool full", 10000, 128, 50000, 1, tuple((p, 0, 1514) for _ in range(6) for p in (1, 2, 3))),
    # Two classes of one port and a second port, frames of every length, alpha 1/2: each
    # class queue is its own against the threshold and its cap (half the buffer).
    PoolCase("classes and lengths, alpha 1/2", 16000, 8, 12000, 2,
             tuple(((1, 0), (1, 1), (2, 0))[i % 3] + (n,) for i, n in enumerate(_lengths(60, 7)))),
)
