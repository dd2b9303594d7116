"""The roles of a run (actor + rollout, reference, critic, reward) and how they are started.

See `rl_core.roles.actors` for what each role does, `rl_core.roles.group` for how the
controller calls a role's ranks, and `rl_core.roles.cluster` for placement on Ray.
"""

from rl_core.roles.group import LocalGroup, RayGroup, RoleFailed, Worker, collect

__all__ = ["LocalGroup", "RayGroup", "RoleFailed", "Worker", "collect"]
