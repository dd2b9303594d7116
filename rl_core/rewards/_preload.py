"""Imported once by the forkserver of `RewardComposer`'s workers: every worker forked from it
starts with math-verify, sympy and the LaTeX parser loaded and warmed up."""

from rl_core.rewards.equivalence import warm_up

warm_up()
