"""Training engines (plain torch) and rollout engines (native) that own a model on a device."""
