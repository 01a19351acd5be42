"""The runnable services, assembled from the subsystems: ``serve`` (the exporter process: poll
path, exposition and the plug-ins it registers), ``demo`` (simulator + exporter + Prometheus
with the packaged rules), ``settings`` (the serve config's keys: the poll path's and the
plug-ins' sections, composed). Their command-line options live in :mod:`specwatch.cli`.

It is the only layer that wires the poll path to the plug-ins.
"""
