"""Experiments, runs, attempts, run events and the run state machine."""
