"""The run folder, ``runs/<id>/``: what a search or a refinement writes, and the checks on output paths.

- :mod:`.emit`: best.yaml plus every registered framework's launch files, written atomically;
- :mod:`.report`: report.md and its plots;
- :mod:`.outputs`: output paths checked before anything runs (never a folder, never an input).
"""
