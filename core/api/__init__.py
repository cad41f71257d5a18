"""What the JSON APIs answer (``views.py``) and what a list of trajectories or groups is
narrowed to (``listing.py``): the top room of the domain, because an answer names every room
below it (a policy's settings, a step's figures, a recorded call's adjustments)."""
