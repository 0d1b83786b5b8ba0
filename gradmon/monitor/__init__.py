"""The writer behind :class:`~gradmon.monitor.callback.LiveMonitor`: step outputs in, log records out.

- :mod:`~gradmon.monitor.callback`: ``LiveMonitor``, the MindSpore ``Callback`` (thin hooks).
- :mod:`~gradmon.monitor.segment`: the validated options and one segment of a run (header, writers, logger).
- :mod:`~gradmon.monitor.steplog`: what is read from the device and when; records, events, abort policy.
- :mod:`~gradmon.monitor.recovery` (the policy) and :mod:`~gradmon.monitor.rollback` (its executor):
  automatic recovery, snapshots and rollback segments (``LiveMonitor(recovery=...)``).
- :mod:`~gradmon.monitor.records`: pure builders of records and events from history rows.
- :mod:`~gradmon.monitor.outputs`: parsing a train step's outputs.
- :mod:`~gradmon.monitor.header`, :mod:`~gradmon.monitor.training_state`, :mod:`~gradmon.monitor.lr`,
  :mod:`~gradmon.monitor.sysmetrics`: what the header, resume, learning rate and system metrics read.
- :mod:`~gradmon.monitor.writer` and :mod:`~gradmon.monitor.writelock`: appending strict JSON lines, one
  writer per log.

Importing this package does not import MindSpore; the modules that need it import it lazily.
"""
