"""Ray shells around the pure objects: HBM page actor, memory-pool actor, controller."""
