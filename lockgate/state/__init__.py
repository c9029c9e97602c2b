"""Versioned, partitioned state for stateful operators, kept on the executors.

See :mod:`lockgate.state.store` for the store and its files, :mod:`lockgate.state.schema`
for the per-operator schema check done on the driver.
"""
