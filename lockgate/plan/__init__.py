"""The logical plan of a streaming query: immutable nodes, and the per-batch planner."""
