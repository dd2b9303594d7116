"""rl_core: the RL post-training library of Ascent (GRPO, DAPO, PPO, DPO on NPU, GPU and CPU).

Importing the package is cheap on purpose: the web process imports `rl_core.spec` to validate run
specs and must never pull in torch or ray. Heavy modules are imported where they are used.
"""

__version__ = "0.1.0"
