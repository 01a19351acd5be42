"""Windows: each model's history and the SD signals derived over its time windows.

``history`` folds every parsed page into its models' bounded rings (``ring``) with the reset
rules; ``base`` finds where each window starts, ``plan`` what a window reads; ``derive``
computes the windowed signals (lazily, ``lazy``), with the per-poll acceptance samples
(``samples``) and their bimodality (``bimodality``). Pure functions over the history: no I/O,
no clock.
"""
