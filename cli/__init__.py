"""The top: the ``burnish`` command (``main.py``) and ``burnish up`` (``up.py``), which start the layers below as processes."""
