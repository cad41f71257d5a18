"""The two ways the gateway talks to a replica, each a ``Connections`` (``base.py``): its own
HTTP/1.1 client (``http1.py``, the fast path) and httpx (``httpx_pool.py``, through a proxy)."""
