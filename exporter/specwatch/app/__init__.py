"""The runnable services, assembled from the subsystems: ``serve`` (the exporter process with
its hooks: live model predictions and the controller), ``live`` (the live-prediction hook that
joins the model to the exporter's snapshots), ``demo`` (simulator + exporter + Prometheus with
the packaged rules).

May import: every subpackage. It is the only layer that wires the poll path to the model and
the controller, so that those stay independent of each other below it.
"""
