"""burnish's client: group an agent's calls into trajectories, post rewards, control training."""

from burnish._api import BurnishError, StepTimeout
from burnish.client import AsyncClient, AsyncGroup, AsyncTrajectory, Client, Group, Trajectory

__all__ = ["AsyncClient", "AsyncGroup", "AsyncTrajectory", "BurnishError", "Client", "Group", "StepTimeout", "Trajectory"]
