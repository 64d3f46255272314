"""Byte units, named once (values carry units in their names: ``_bytes``, ``_gib``)."""

GiB = 1024**3
