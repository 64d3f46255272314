"""The search: the candidate space of valid plans, priced by the cost model and ranked.

- :mod:`.candidates`: the space (layouts, train options, rollout options), built from divisors;
- :mod:`.driver`: :func:`~.driver.search`, the factored evaluation of that space;
- :mod:`.rank`: step time, throughput, the rank key and the Pareto front;
- :mod:`.grouping`: one row per distinct layout for the top table;
- :mod:`.log_prob`: the log-prob passes' own micro-batch;
- :mod:`.tune`: the search seeded by a user's launch (``grpo-tune tune``).
"""
