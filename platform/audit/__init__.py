"""The audit log: who changed what, when and from where."""
