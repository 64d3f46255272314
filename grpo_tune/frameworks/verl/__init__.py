"""verl 0.9.1 (Megatron backend): everything that spells a verl key or reads a verl file.

- :mod:`.table`: the one table from plan fields to verl keys (write and read);
- :mod:`.snapshot`: the pinned release's composed key tree, fetched, composed and snapshotted;
- :mod:`.export`: a run config as Hydra overrides and a bash launch;
- :mod:`.launch` and :mod:`.script`: a user's launch read back, and its edited copy for ``tune``;
- :mod:`.diagnose`: the launch checker, its bash reader and its rules.
"""
