"""The run-log contract every reader and writer shares (docs/format.md).

- :mod:`~gradmon.logformat.schema`: field names, flags, alarm kinds (mirrored by
  ``dashboard/src/lib/schema.js``).
- :mod:`~gradmon.logformat.jsonl`: strict JSON encoding of one record, decoding and validation of one line
  (mirrored by ``dashboard/src/lib/jsonl.js``).
- :mod:`~gradmon.logformat.lines`: splitting bytes into complete lines, never a half-written one.
- :mod:`~gradmon.logformat.values`: what a value is read as: a number (never a bool; an integer too
  big for a float is infinite), finite or not.
- :mod:`~gradmon.logformat.alarms`: the alarm rule, pure; the writer and the server run the same one.
- :mod:`~gradmon.logformat.reader`: :func:`read_records`, the valid records of a log file.

No MindSpore import here: the server (``gradmon serve``) uses only this package of the host side.
"""
