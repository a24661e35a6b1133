"""The simulated machine: cost constants, port model and node layout (:class:`Network`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Network", "UNIT_NETWORK"]


@dataclass(frozen=True)
class Network:
    """Cost-model constants and port model of the simulated machine."""

    alpha: float = 2e-6
    beta: float = 8e-11
    gamma: float = 1e-10
    ports: int = 1
    ranks_per_node: int = 1
    inter_alpha: float | None = None
    inter_beta: float | None = None
    nic_ports: int = 1
    #: seconds per byte of a copy into or out of a node window slot (None: ``beta``)
    copy_beta: float | None = None
    #: seconds from a node post to the await that sees it (None: ``alpha / 4``)
    sync: float | None = None

    @classmethod
    def from_profile(cls, profile=None, **overrides) -> "Network":
        """Build a network from a :class:`mlcomm.model.machine.Profile` (default: the loaded
        one)."""
        if profile is None:
            from ...model.machine import load_profile
            profile = load_profile()
        net = cls(alpha=profile.alpha, beta=profile.beta, gamma=profile.gamma)
        return replace(net, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def two_level(self) -> bool:
        return self.ranks_per_node > 1

    @property
    def copy_cost(self) -> float:
        """Seconds per byte copied into or out of a window slot."""
        return self.beta if self.copy_beta is None else self.copy_beta

    @property
    def sync_cost(self) -> float:
        """Seconds from a node post to the await that sees it."""
        return self.alpha / 4 if self.sync is None else self.sync

    @property
    def between_alpha(self) -> float:
        """Latency of a message between nodes."""
        return self.alpha if self.inter_alpha is None else self.inter_alpha

    @property
    def between_beta(self) -> float:
        """Seconds per byte of a message between nodes."""
        return self.beta if self.inter_beta is None else self.inter_beta


#: alpha = 1, sync = 1 and nothing else: the simulated time is the number of rounds, a
#: round being one message time or one node synchronisation.
UNIT_NETWORK = Network(alpha=1.0, beta=0.0, gamma=0.0, ports=0, copy_beta=0.0, sync=1.0)
