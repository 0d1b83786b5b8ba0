"""Optional integrations of gradmon with other training frameworks.

Nothing here is imported by :mod:`gradmon`; each integration imports its framework only when the
user imports it (``import gradmon.integrations.mindformers``). See docs/mindformers.md.
"""
