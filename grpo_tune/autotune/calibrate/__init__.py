"""Calibration: fit the time model's efficiencies to measurements, from trials or from a user's run logs.

- :mod:`.fit`: the bounded least-squares fit, and calibration files (save, load);
- :mod:`.stats`: MAPE and Spearman, shared with the refinement's report;
- :mod:`.runlog`: a training run's per-step log read into records (our metrics.jsonl here, every other log by
  the framework that writes it, through the registry), and the fit from logs;
- :mod:`.lengths`: prompt and response length statistics from a dataset or a run log.
"""
