"""Fetch: the HTTP client of the poll path.

One poll's GET of a target's ``/metrics`` under a total deadline and a size cap (``client``),
over one of two transports: a persistent ``http.client`` connection per target (``direct``,
with ``httpfast`` and ``httpheaders`` reading its usual response) or ``requests`` where the
environment routes the URL through a proxy (``proxied``). ``rules`` holds what both share
(the target, error reasons, request headers); ``guard`` shuts a poll's sockets when its
deadline is due.
"""
