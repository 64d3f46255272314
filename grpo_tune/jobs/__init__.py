"""Each command's work, below the CLI: ``cli/`` parses the flags into a request, calls one job here, and
prints the outcome it returns (tables, JSON and plots of the terminal stay in ``cli/``).

``setup`` is the preamble the planning commands share (the frameworks and stack it plans for, the
``--out`` folder checked before any work, the ``--calibration`` file); ``inputs`` turns flag values into
the typed target; ``search``, ``compare``, ``estimate``, ``tune``, ``validate``, ``diagnose``, ``calibrate``,
``train``, ``profile``, ``probe`` (``probe-hardware``) and ``catalog`` (``models``, ``hardware``) hold the
commands of those names (``train`` also the pre-start checks ``profile`` shares).
"""
